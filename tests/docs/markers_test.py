#!/usr/bin/env python3
"""docs_code_test.py's reading of the docs (unittest, no build): which blocks it finds, which
marker each gets, that an unmarked block, a stray marker or a marker of the wrong kind is an
error, and the translation unit a wrapped block becomes."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docs_code_test as dct  # noqa: E402


def scan(text):
    """(blocks, errors) of a Markdown file with this text."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "doc.md")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        errors = []
        return dct.scan(path, "doc.md", errors), errors


PROGRAM = "```cpp\n#include <tutti/tutti.h>\nint main() {}\n```\n"
STATEMENTS = "```c++\ntutti::Tensor t;\n```\n"


class Markers(unittest.TestCase):
    def test_every_mode_is_read(self):
        blocks, errors = scan("<!-- doc-test: run np=2-->\n" + PROGRAM + "\n<!-- doc-test: compile -->\n\n" + PROGRAM +
                              "<!-- doc-test: wrap-main\nint n = 1;\n-->\n" + STATEMENTS +
                              "<!-- doc-test: wrap-file -->\n" + STATEMENTS +
                              "<!-- doc-test: fragment declarations for reading -->\n" + STATEMENTS)
        self.assertEqual(errors, [])
        self.assertEqual([b.mode for b in blocks], ["run", "compile", "wrap-main", "wrap-file", "fragment"])
        self.assertEqual(blocks[0].options, {"np": "2"})
        self.assertEqual(blocks[2].setup, ["int n = 1;"])
        self.assertEqual(blocks[4].reason, "declarations for reading")

    def test_an_unmarked_block_is_an_error(self):
        blocks, errors = scan("Text.\n\n" + STATEMENTS + "\n```sh\nls\n```\n")
        self.assertEqual(len(blocks), 1)  # the sh block is not C++
        self.assertEqual(len(errors), 1)
        self.assertIn("doc.md:3: C++ block without a doc-test marker", errors[0])

    def test_cpp_without_a_language_is_an_error(self):
        _, errors = scan("```\nauto t = tutti::Tensor::zeros({2});\n```\n")
        self.assertIn("doc.md:1: a block without a language that looks like C++", errors[0])
        # A program's output is not C++.
        self.assertEqual(scan("```\ntutti [rank 0]: TIMEOUT: tutti::Error in step 3\n```\n"), ([], []))

    def test_a_comment_that_is_no_marker_leaves_the_block_unmarked(self):
        _, errors = scan("<!-- a note -->\n" + STATEMENTS)
        self.assertIn("without a doc-test marker", errors[0])

    def test_a_marker_without_a_block_is_an_error(self):
        _, errors = scan("<!-- doc-test: run -->\nText.\n\n" + PROGRAM)
        self.assertTrue(any("doc.md:1: doc-test marker not followed by a ```cpp block" in e for e in errors), errors)

    def test_markers_inside_other_blocks_are_text(self):
        blocks, errors = scan("```md\n<!-- doc-test: run -->\n```\n")
        self.assertEqual((blocks, errors), ([], []))

    def test_wrong_kinds_are_errors(self):
        for marker, block, message in [("run", STATEMENTS, "has no `int main`"),
                                       ("compile", STATEMENTS, "has no `int main`"),
                                       ("wrap-main", PROGRAM, "a whole program marked wrap-main"),
                                       ("wrap-file", PROGRAM, "a whole program marked wrap-file"),
                                       ("compile np=2", PROGRAM, "mean something only for run"),
                                       ("run ranks=2", PROGRAM, "unknown run option"),
                                       ("wrapmain", STATEMENTS, "unknown doc-test mode")]:
            with self.subTest(marker=marker):
                _, errors = scan(f"<!-- doc-test: {marker} -->\n" + block)
                self.assertTrue(any(message in e for e in errors), errors)

    def test_wrapped_statements_keep_their_lines(self):
        blocks, errors = scan("Text.\n<!-- doc-test: wrap-main\nint n = 1;\n-->\n" + STATEMENTS)
        self.assertEqual(errors, [])
        src = dct.source_of(blocks[0]).split("\n")
        self.assertIn("#include <tutti/tutti.h>", src)
        main = src.index("int main(int argc, char** argv) {")
        # The setup line (line 3 of the doc), then the block's first line (line 6).
        self.assertEqual(src[src.index("int n = 1;") - 1], f'#line 3 "{blocks[0].path}"')
        self.assertEqual(src[src.index("tutti::Tensor t;") - 1], f'#line 6 "{blocks[0].path}"')
        self.assertLess(main, src.index("int n = 1;"))

    def test_whole_programs_are_compiled_as_written(self):
        blocks, _ = scan("<!-- doc-test: compile -->\n" + PROGRAM)
        src = dct.source_of(blocks[0]).split("\n")
        self.assertEqual(src[1:4], [f'#line 3 "{blocks[0].path}"', "#include <tutti/tutti.h>", "int main() {}"])


if __name__ == "__main__":
    unittest.main()
