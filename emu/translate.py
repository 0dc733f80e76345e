#!/usr/bin/env python3
"""Translates one CUDA source of tutti (.cu or .cuh) into C++ for the emulated CUDA device.

The .cu files stay the single source: nvcc compiles them for the GPU, and this rewrites the
two constructs C++ cannot express, at build time, into calls of emu/include/tutti_emu/kernel.h:

  kernel<<<grid, block[, shared[, stream]]>>>(args)
      -> ::tutti::emu::launch_kernel(::tutti::emu::LaunchConfig(grid, block, ...), "kernel",
             __FILE__, __LINE__, [=](auto... a) { kernel(a...); }, args)
  __shared__ T name[dims];
      -> static char <key>; auto& name = ::tutti::emu::block_shared<T[dims]>(&<key>);
  extern __shared__ T name[];
      -> T* name = ::tutti::emu::dynamic_shared<T>();

Comments and string literals are left alone. Every rewrite keeps the newlines of what it
replaces and the output starts with a #line directive, so compiler errors, sanitizer reports
and the emulator's fault reports name the line of the .cu file.

--mutate FIND REPLACE (for the mutation check) first replaces the one occurrence of FIND (both
may use Python's escapes: \n for a newline, \x3b for ';').
"""
import argparse
import codecs
import os
import re
import sys


class TranslateError(Exception):
    pass


def mask_comments_and_strings(text):
    """A copy of text of the same length where comments and literals are blanked (newlines kept)."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def match_forward(mask, start, open_ch, close_ch):
    """Index of the bracket closing the one at mask[start]."""
    depth = 0
    for k in range(start, len(mask)):
        if mask[k] == open_ch:
            depth += 1
        elif mask[k] == close_ch:
            depth -= 1
            if depth == 0:
                return k
    raise TranslateError(f"unbalanced '{open_ch}' at line {line_of(mask, start)}")


def kernel_start(mask, end):
    """Start of the kernel expression that ends just before mask[end] (a name, maybe <template args>)."""
    j = end - 1
    while j >= 0 and mask[j].isspace():
        j -= 1
    if j >= 0 and mask[j] == ">":
        depth = 0
        while j >= 0:
            if mask[j] == ">":
                depth += 1
            elif mask[j] == "<":
                depth -= 1
                if depth == 0:
                    break
            j -= 1
        j -= 1
        while j >= 0 and mask[j].isspace():
            j -= 1
    k = j
    while k >= 0 and (mask[k].isalnum() or mask[k] in "_:"):
        k -= 1
    if k == j:
        raise TranslateError(f"no kernel name before <<< at line {line_of(mask, end)}")
    return k + 1


def pad_newlines(original, replacement):
    missing = original.count("\n") - replacement.count("\n")
    if missing < 0:
        raise TranslateError("a rewrite added lines")
    return replacement + "\n" * missing


def rewrite_launches(text):
    mask = mask_comments_and_strings(text)
    edits = []
    pos = 0
    while True:
        i = mask.find("<<<", pos)
        if i < 0:
            break
        start = kernel_start(mask, i)
        close = mask.find(">>>", i + 3)
        if close < 0:
            raise TranslateError(f"<<< without >>> at line {line_of(text, i)}")
        p = close + 3
        while p < len(mask) and mask[p].isspace():
            p += 1
        if p >= len(mask) or mask[p] != "(":
            raise TranslateError(f"no argument list after >>> at line {line_of(text, close)}")
        q = match_forward(mask, p, "(", ")")
        kernel = text[start:i].strip()
        config = text[i + 3:close]
        args = text[p + 1:q]
        name = " ".join(kernel.split())
        replacement = (
            f'::tutti::emu::launch_kernel(::tutti::emu::LaunchConfig({config}), "{name}", __FILE__, __LINE__, '
            f"[=](auto... tutti_emu_args) {{ {' '.join(kernel.split())}(tutti_emu_args...); }}"
            + (f", {args}" if args.strip() else "")
            + ")"
        )
        edits.append((start, q + 1, pad_newlines(text[start:q + 1], replacement)))
        pos = q + 1
    return apply_edits(text, edits)


SHARED = re.compile(r"(\bextern\s+)?\b__shared__\b([^;{}]*);")
ATTRIBUTES = re.compile(r"__align__\s*\([^)]*\)|alignas\s*\([^)]*\)|__attribute__\s*\(\([^)]*\)\)")
DECLARATOR = re.compile(r"^(?P<type>.*?)\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(\[[^\]]*\]\s*)*)$", re.S)


def rewrite_shared(text):
    mask = mask_comments_and_strings(text)
    edits = []
    for m in SHARED.finditer(mask):
        original = text[m.start():m.end()]
        decl = ATTRIBUTES.sub(" ", text[m.start(2):m.end(2)]).strip()
        if "," in decl.split("[")[0] or "=" in decl:
            raise TranslateError(f"line {line_of(text, m.start())}: one __shared__ variable per declaration, "
                                 f"without an initializer: {original.strip()}")
        d = DECLARATOR.match(decl)
        if not d or not d.group("type").strip():
            raise TranslateError(f"line {line_of(text, m.start())}: cannot read the __shared__ declaration "
                                 f"{original.strip()}")
        type_, name, dims = " ".join(d.group("type").split()), d.group("name"), "".join(d.group("dims").split())
        if m.group(1):
            if dims != "[]":
                raise TranslateError(f"line {line_of(text, m.start())}: extern __shared__ must be an array of "
                                     f"unknown size: {original.strip()}")
            replacement = f"{type_}* {name} = ::tutti::emu::dynamic_shared<{type_}>();"
        else:
            key = f"tutti_emu_shared_{name}"
            replacement = (f"static char {key}; "
                           f"auto& {name} = ::tutti::emu::block_shared<{type_}{dims}>(&{key});")
        edits.append((m.start(), m.end(), pad_newlines(original, replacement)))
    return apply_edits(text, edits)


def apply_edits(text, edits):
    out, pos = [], 0
    for start, end, replacement in sorted(edits):
        out.append(text[pos:start])
        out.append(replacement)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def translate(text, source_path):
    text = rewrite_shared(rewrite_launches(text))
    if "<<<" in mask_comments_and_strings(text):
        raise TranslateError("a <<< was left")
    return f'#line 1 "{source_path}"\n' + text


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source")
    parser.add_argument("output")
    parser.add_argument("--mutate", nargs=2, metavar=("FIND", "REPLACE"), action="append", default=[])
    args = parser.parse_args()
    with open(args.source, encoding="utf-8") as f:
        text = f.read()
    for find, replace in args.mutate:
        # Escapes, so that CMake can pass ';' (\x3b) and newlines (\n).
        find, replace = (codecs.decode(x, "unicode_escape") for x in (find, replace))
        count = text.count(find)
        if count != 1:
            sys.exit(f"translate.py: --mutate: '{find}' occurs {count} times in {args.source}, expected once")
        text = text.replace(find, replace)
    try:
        result = translate(text, os.path.abspath(args.source))
    except TranslateError as e:
        sys.exit(f"{args.source}: {e}")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    if os.path.exists(args.output):
        with open(args.output, encoding="utf-8") as f:
            if f.read() == result:
                return
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(result)


if __name__ == "__main__":
    main()
