"""The book's table of the diagnosis's mechanisms (docs/src/diagnosis.md, between
`<!-- mechanisms:start -->` and `<!-- mechanisms:end -->`) says only what is true: every mechanism
the diagnosis has is in a row, every name in a row is a mechanism it has, and the test a row cites
as showing it exists."""

import os
import re
import unittest

try:
    import torch  # noqa: F401  (the diagnosis needs torch to import)
except ImportError:
    torch = None

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHAPTER = os.path.join(ROOT, "docs", "src", "diagnosis.md")


def rows():
    """(names, family, test references) of each row of the table."""
    with open(CHAPTER, encoding="utf-8") as f:
        text = f.read()
    table = text.split("<!-- mechanisms:start -->", 1)[1].split("<!-- mechanisms:end -->", 1)[0]
    out = []
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", cells[0])
        tests = re.findall(r"`([^`]+::[^`]+)`", cells[3])
        out.append((names, cells[1], tests))
    return out


@unittest.skipIf(torch is None, "needs torch")
class MechanismsTableTest(unittest.TestCase):
    def test_every_mechanism_has_a_row_and_every_row_a_mechanism(self):
        from golden_ref.mutations import mechanisms

        listed = [name for names, _, _ in rows() for name in names]
        self.assertEqual(len(listed), len(set(listed)), "a mechanism listed twice")
        have = set(mechanisms())
        self.assertEqual(sorted(have - set(listed)), [], "mechanisms the book's table does not list")
        self.assertEqual(sorted(set(listed) - have), [], "rows naming no mechanism of the diagnosis")

    def test_the_families_are_the_kinds_candidates_are_counted_by(self):
        from golden_ref.catalogue import CATALOGUE
        from golden_ref.mutations import KINDS

        kinds = {m.key: m.kind for m in CATALOGUE}
        for names, family, _ in rows():
            self.assertIn(family, KINDS + ("schedule",), f"{names}: {family}")
            for name in names:
                if name in kinds:
                    self.assertEqual(kinds[name], family, name)

    def test_each_row_cites_a_test_that_exists(self):
        for names, _, tests in rows():
            self.assertTrue(tests, f"{names}: no test cited")
            for cited in tests:
                path, _, name = cited.partition("::")
                with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                    source = f.read()
                self.assertRegex(source, rf"\b{re.escape(name)}\b", cited)


if __name__ == "__main__":
    unittest.main()
