#!/usr/bin/env python3
"""Every C++ block of README.md and docs/*.md, and every example in the comments of the public
headers (include/tutti/**/*.h), compiled against the installed package.

At test time (never from a committed copy, so that a doc edit is checked by the next run):
reads the Markdown files, finds every ```cpp / ```c++ block and the marker right before it,
installs the build into a private prefix (`cmake --install`), writes one small CMake project
that finds tutti with find_package(tutti), as a user's project would, with one executable per
whole program and one for all the wrapped blocks together (each in a namespace of its own),
builds it (-j2, every block even when one fails), then runs the blocks marked
`run` and checks that they exit with 0. docs/development.md ("Code in the docs") states the
convention:

  <!-- doc-test: run [np=N] -->   a whole program (has `int main`): compiled, linked and run,
                                  alone or under `mpiexec -n N` (a few seconds at most)
  <!-- doc-test: compile -->      a whole program: compiled and linked, not run
  <!-- doc-test: wrap-main        statements: placed in a block inside `int statements(int argc,
  optional lines of setup code    char** argv)` (as main's body, in the block's own namespace),
  -->                             after the setup lines of the comment (not rendered; they
                                  declare what the statements use)
  <!-- doc-test: wrap-file        declarations: placed in the block's own namespace after the
  optional setup lines -->        setup lines
  <!-- doc-test: fragment REASON -->  not compiled (counted): only for what cannot compile alone

Wrapped blocks see <tutti/tutti.h> and a few standard headers (WRAP_INCLUDES). A C++ block
without a marker, a marker without a block, a whole program marked wrap-* or a statement block
marked run/compile fail the test, so that no block goes unchecked silently. Compiler errors
name the Markdown file and line (#line directives).
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import time

CPP_LANGS = {"cpp", "c++", "cc", "cxx", "hpp"}
MODES = ("run", "compile", "wrap-main", "wrap-file", "fragment")
WRAP_INCLUDES = ["tutti/tutti.h", "cmath", "cstdint", "cstdio", "exception", "functional", "memory", "optional",
                 "string", "utility", "vector"]
FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([^\s`{]*)")
MARKER_START = re.compile(r"^ {0,3}<!--\s*doc-test:\s*(\S+?)(\s.*|-->.*|)$")
HAS_MAIN = re.compile(r"\bint\s+main\s*\(")
# C++ in a block without a language (where a program's output would not look like this).
LOOKS_LIKE_CPP = re.compile(r"^\s*#include\s*[<\"]|\bint\s+main\s*\(|\btutti::[\w:]+.*;\s*(//.*)?$")
RUN_TIMEOUT_S = 60


class Block:
    def __init__(self, path, rel, line, code):
        self.path = path  # the Markdown file
        self.rel = rel  # its path in the checkout, for messages
        self.line = line  # the line of the opening fence (1-based)
        self.code = code  # the lines between the fences
        self.mode = None
        self.options = {}
        self.reason = ""
        self.setup = []  # setup lines of a wrap-* marker
        self.setup_line = 0  # the marker's first line (the setup lines follow it)

    def where(self):
        return f"{self.rel}:{self.line}"

    def target(self):
        """The executable's name: doc_<file>_L<line>."""
        return "doc_" + re.sub(r"[^A-Za-z0-9]+", "_", os.path.splitext(self.rel)[0]) + f"_L{self.line}"


def parse_marker(lines, end, rel, errors):
    """The doc-test marker whose comment ends on line index `end` (0-based), or None: a
    (mode, argument text, setup lines, the marker's first line, 1-based) tuple."""
    if "-->" not in lines[end]:
        return None
    start = end
    while start >= 0 and "<!--" not in lines[start]:
        start -= 1
    if start < 0:
        return None
    m = MARKER_START.match(lines[start])
    if not m:
        return None
    mode, rest = m.group(1), m.group(2)
    if start == end:
        rest = rest[:rest.index("-->")]
        setup = []
    else:
        setup = lines[start + 1:end]
        tail = lines[end][:lines[end].index("-->")]
        if tail.strip():
            setup.append(tail)
    if mode not in MODES:
        errors.append(f"{rel}:{start + 1}: unknown doc-test mode '{mode}' (one of {', '.join(MODES)})")
    return mode, rest.strip(), setup, start + 1


def scan(path, rel, errors):
    """The C++ blocks of one Markdown file, each with its marker; errors for unmarked blocks
    and stray markers."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks = []
    used_markers = set()
    in_fence = set()  # line indices inside fenced blocks of any language
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(2), m.group(3).lower()
        close = re.compile("^ {0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        in_fence.update(range(i, j + 1))
        if not lang and any(LOOKS_LIKE_CPP.search(line) for line in lines[i + 1:j]):
            errors.append(f"{rel}:{i + 1}: a block without a language that looks like C++: "
                          f"open it with ```cpp and a doc-test marker (or name its language)")
        if lang in CPP_LANGS:
            block = Block(path, rel, i + 1, lines[i + 1:j])
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            marker = parse_marker(lines, k, rel, errors) if k >= 0 else None
            if marker is None:
                errors.append(f"{block.where()}: C++ block without a doc-test marker: put one of "
                              f"<!-- doc-test: {' | '.join(MODES)} --> right before it "
                              f"(docs/development.md, \"Code in the docs\")")
            else:
                block.mode, args, block.setup, block.setup_line = marker
                used_markers.add(k)
                if block.mode == "fragment":
                    block.reason = args
                else:
                    for word in args.split():
                        key, _, value = word.partition("=")
                        block.options[key] = value
                check_block(block, errors)
            blocks.append(block)
        i = j + 1
    for n, line in enumerate(lines):
        if n not in in_fence and MARKER_START.match(line):
            end = n
            while end < len(lines) and "-->" not in lines[end]:
                end += 1
            if end not in used_markers:
                errors.append(f"{rel}:{n + 1}: doc-test marker not followed by a ```cpp block")
    return blocks


HEADER_MARKER = re.compile(r"^\s*//\s*doc-test:\s*(\S+)(.*)$")
HEADER_SETUP = re.compile(r"^\s*//\s*setup:\s?(.*)$")
HEADER_CODE = re.compile(r"^\s*//   (.*)$")


def scan_header(path, rel, errors):
    """The examples in the comments of one public header: a marker line `// doc-test: MODE [args]`,
    for wrap-* optional `// setup: LINE` lines, then the example, every line `//   CODE` (three
    spaces). An example that looks like C++ without a marker is an error, as in the docs."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks = []
    marked = set()
    i = 0
    while i < len(lines):
        m = HEADER_MARKER.match(lines[i])
        if not m:
            i += 1
            continue
        mode, args = m.group(1), m.group(2).strip()
        if mode not in MODES:
            errors.append(f"{rel}:{i + 1}: unknown doc-test mode '{mode}' (one of {', '.join(MODES)})")
        j = i + 1
        setup = []
        while j < len(lines) and HEADER_SETUP.match(lines[j]):
            setup.append(HEADER_SETUP.match(lines[j]).group(1))
            j += 1
        first = j
        while j < len(lines) and HEADER_CODE.match(lines[j]):
            j += 1
        if first == j:
            errors.append(f"{rel}:{i + 1}: doc-test marker not followed by an example (lines '//   code')")
            i = j
            continue
        block = Block(path, rel, first, [HEADER_CODE.match(line).group(1) for line in lines[first:j]])
        block.mode, block.setup, block.setup_line = mode, setup, i + 1
        if mode == "fragment":
            block.reason = args
        else:
            for word in args.split():
                key, _, value = word.partition("=")
                block.options[key] = value
        check_block(block, errors)
        blocks.append(block)
        marked.update(range(first, j))
        i = j
    n = 0
    while n < len(lines):  # unmarked examples
        if HEADER_CODE.match(lines[n]) and n not in marked:
            start = n
            while n < len(lines) and HEADER_CODE.match(lines[n]) and n not in marked:
                n += 1
            code = [HEADER_CODE.match(line).group(1) for line in lines[start:n]]
            # Headers' examples are comment lines set off by an empty one (prose that wraps under a
            # list item is not): there a statement's ';' also tells.
            set_off = start > 0 and lines[start - 1].strip() == "//"
            if any(LOOKS_LIKE_CPP.search(line) or (set_off and re.search(r";\s*(//.*)?$", line)) for line in code):
                errors.append(f"{rel}:{start + 1}: an example in a comment without a doc-test marker: put "
                              f"'// doc-test: {' | '.join(MODES)}' on the line before it "
                              f"(docs/development.md, \"Code in the docs\")")
        n += 1
    return blocks


def check_block(block, errors):
    has_main = any(HAS_MAIN.search(line) for line in block.code)
    if block.mode in ("run", "compile") and not has_main:
        errors.append(f"{block.where()}: marked {block.mode} but has no `int main`: mark it wrap-main "
                      f"(statements), wrap-file (declarations) or fragment")
    if block.mode in ("wrap-main", "wrap-file") and has_main:
        errors.append(f"{block.where()}: a whole program marked {block.mode}: mark it run or compile")
    if block.mode != "run" and block.options:
        errors.append(f"{block.where()}: options {block.options} mean something only for run")
    for key, value in block.options.items():
        if key != "np" or not value.isdigit() or int(value) < 1:
            errors.append(f"{block.where()}: unknown run option '{key}={value}' (np=N)")
    if block.mode in ("run", "compile", "fragment") and block.setup:
        errors.append(f"{block.where()}: setup lines mean something only for wrap-main and wrap-file")


def line_directive(line, path):
    return f'#line {line} "{path}"'


def source_of(block):
    """The translation unit of one block."""
    head = [f"// Generated by tests/docs/docs_code_test.py from {block.where()} ({block.mode})."]
    if block.mode in ("run", "compile"):
        return "\n".join(head + [line_directive(block.line + 1, block.path)] + block.code) + "\n"
    out = head + [f"#include <{h}>" for h in WRAP_INCLUDES]
    setup = [line_directive(block.setup_line + 1, block.path)] + block.setup if block.setup else []
    body = [line_directive(block.line + 1, block.path)] + block.code
    if block.mode == "wrap-file":
        out += setup + body + ["#line 1 \"doc-test-main\"", "int main() { return 0; }"]
    else:
        out += ["int main(int argc, char** argv) {", "  (void)argc;", "  (void)argv;"] + setup
        out += ["  {"] + body + ["#line 1 \"doc-test-main\"", "  }", "  return 0;", "}"]
    return "\n".join(out) + "\n"


WRAPPED_TARGET = "doc_wrapped_blocks"


def wrapped_source(blocks):
    """One translation unit of every wrap-main and wrap-file block, each in a namespace of its own
    (wrap-main's statements in a function there), so that a cold build parses the library's
    headers once for all of them rather than once per block: 25 blocks took 41 s on 2 cores as
    executables of their own."""
    out = [f"// Generated by tests/docs/docs_code_test.py: the {len(blocks)} wrapped blocks of the docs."]
    out += [f"#include <{h}>" for h in WRAP_INCLUDES]
    for b in blocks:
        setup = [line_directive(b.setup_line + 1, b.path)] + b.setup if b.setup else []
        body = [line_directive(b.line + 1, b.path)] + b.code
        out += ['#line 1 "doc-test-wrapper"', f"namespace {b.target()} {{  // {b.where()} ({b.mode})"]
        if b.mode == "wrap-file":
            out += setup + body
        else:
            # As main's body (statements may `return 1;`).
            out += ["int statements(int argc, char** argv) {", "  (void)argc;", "  (void)argv;"] + setup
            out += ["  {"] + body + ['#line 1 "doc-test-wrapper"', "  }", "  return 0;", "}"]
        out += ['#line 1 "doc-test-wrapper"', f"}}  // namespace {b.target()}"]
    out += ["int main() { return 0; }"]
    return "\n".join(out) + "\n"


def write_if_changed(path, text):
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def run(cmd, **kwargs):
    """The finished process (output and error together) and its wall time in seconds."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    return p, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source-dir", required=True, help="the tutti checkout (README.md, docs/)")
    ap.add_argument("--build-dir", help="the build to install; without it, only check the markers")
    ap.add_argument("--workdir", help="where the prefix and the project go")
    ap.add_argument("--cmake", default="cmake")
    ap.add_argument("--generator", default="Ninja")
    ap.add_argument("--cxx-compiler", help="the compiler the build used")
    ap.add_argument("--launcher", default="", help="a compiler launcher (ccache)")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("docs", nargs="*", help="Markdown files (default: README.md and docs/*.md)")
    args = ap.parse_args()

    root = os.path.abspath(args.source_dir)
    docs = [os.path.abspath(d) for d in args.docs] or \
        [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    headers = [] if args.docs else sorted(glob.glob(os.path.join(root, "include", "tutti", "**", "*.h"), recursive=True))
    errors = []
    blocks = []
    for doc in docs:
        blocks += scan(doc, os.path.relpath(doc, root), errors)
    for header in headers:
        blocks += scan_header(header, os.path.relpath(header, root), errors)
    docs += headers
    if errors:
        print("\n".join(errors))
        print(f"FAILED: {len(errors)} marker error(s) in {len(blocks)} C++ block(s)")
        return 1
    compiled = [b for b in blocks if b.mode != "fragment"]
    ran = [b for b in blocks if b.mode == "run"]
    fragments = [b for b in blocks if b.mode == "fragment"]
    counts = (f"{len(blocks)} C++ blocks in {len(docs)} files: {len(compiled)} compiled "
              f"({len(ran)} of them run), {len(fragments)} fragments")
    for b in blocks:
        print(f"  {b.where()}: {b.mode} {b.reason}".rstrip())
    if not args.build_dir:
        print(counts + " (markers only)")
        return 0

    work = os.path.abspath(args.workdir)
    prefix = os.path.join(work, "prefix")
    project = os.path.join(work, "project")
    build = os.path.join(work)
    os.makedirs(os.path.join(project, "blocks"), exist_ok=True)

    p, t_install = run([args.cmake, "--install", args.build_dir, "--prefix", prefix])
    if p.returncode != 0:
        print(p.stdout)
        print("FAILED: cmake --install")
        return 1

    cml = ["# Generated by tests/docs/docs_code_test.py: every compiled C++ block of the docs, one",
           "# executable each, built against the installed tutti as a user's project would be.",
           "cmake_minimum_required(VERSION 3.25)", "project(tutti_docs_code LANGUAGES CXX)",
           "set(CMAKE_CXX_STANDARD 20)", "set(CMAKE_CXX_STANDARD_REQUIRED ON)", "find_package(tutti REQUIRED)"]
    # Whole programs one executable each; the wrapped blocks all in one (wrapped_source).
    programs = [b for b in compiled if b.mode in ("run", "compile")]
    wrapped = [b for b in compiled if b.mode in ("wrap-main", "wrap-file")]
    sources = [(b.target(), source_of(b)) for b in programs]
    if wrapped:
        sources.append((WRAPPED_TARGET, wrapped_source(wrapped)))
    wanted = set()
    for name, text in sources:
        wanted.add(name + ".cc")
        write_if_changed(os.path.join(project, "blocks", name + ".cc"), text)
        cml += [f"add_executable({name} blocks/{name}.cc)", f"target_link_libraries({name} PRIVATE tutti::tutti)"]
    for old in os.listdir(os.path.join(project, "blocks")):
        if old not in wanted:
            os.remove(os.path.join(project, "blocks", old))
    write_if_changed(os.path.join(project, "CMakeLists.txt"), "\n".join(cml) + "\n")

    configure = [args.cmake, "-S", project, "-B", build, "-G", args.generator, f"-DCMAKE_PREFIX_PATH={prefix}"]
    if args.cxx_compiler:
        configure.append(f"-DCMAKE_CXX_COMPILER={args.cxx_compiler}")
    if args.launcher:
        configure.append(f"-DCMAKE_CXX_COMPILER_LAUNCHER={args.launcher}")
    p, t_configure = run(configure)
    if p.returncode != 0:
        print(p.stdout)
        print("FAILED: configuring the project of the doc blocks against the installed tutti")
        return 1

    # An executable exists after the build exactly when its blocks compiled and linked.
    def exe(b):
        return os.path.join(build, b.target() if b.mode in ("run", "compile") else WRAPPED_TARGET)

    for name, _ in sources:
        if os.path.exists(os.path.join(build, name)):
            os.remove(os.path.join(build, name))
    keep_going = ["--", "-k", "0"] if "Ninja" in args.generator else ["--", "-k"]
    p, t_build = run([args.cmake, "--build", build, "-j", str(args.jobs)] + keep_going)
    failed = [b for b in compiled if not os.path.exists(exe(b))]
    if p.returncode != 0 or failed:
        print(p.stdout)
        for b in failed:
            together = " (built with the other wrapped blocks: the errors above name each one's line)" \
                if b.mode.startswith("wrap") else ""
            print(f"{b.where()}: this {b.mode} block does not compile or link against the installed tutti{together} "
                  f"(fix the doc, it shows the API as it is)")
        print(f"FAILED: {len(failed)} of {len(compiled)} compiled blocks")
        return 1

    run_failures = 0
    t_run = 0.0
    for b in ran:
        cmd = [exe(b)]
        if b.options.get("np"):
            cmd = [args.mpiexec, "-n", b.options["np"], "--oversubscribe"] + cmd
        try:
            p, t = run(cmd, timeout=RUN_TIMEOUT_S, cwd=work)
        except subprocess.TimeoutExpired:
            print(f"{b.where()}: did not end within {RUN_TIMEOUT_S} s: {' '.join(cmd)}")
            run_failures += 1
            continue
        t_run += t
        if p.returncode != 0:
            print(p.stdout)
            print(f"{b.where()}: exit code {p.returncode}, not 0: {' '.join(cmd)}")
            run_failures += 1
        else:
            print(f"  ran {b.where()} in {t:.1f} s")
    if run_failures:
        print(f"FAILED: {run_failures} of {len(ran)} run blocks")
        return 1
    print(f"OK: {counts} (install {t_install:.1f} s, configure {t_configure:.1f} s, build {t_build:.1f} s, "
          f"runs {t_run:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
