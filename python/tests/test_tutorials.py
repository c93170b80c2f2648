"""The documentation's tutorials and guide run as written (issue 44).

Every page under docs/tutorials/ (and docs/guide/) is read, and its code
blocks run in order, as a reader would type them, in a fresh folder:
```python blocks in one interpreter (a page's blocks share their
variables, as in a notebook), ```sh blocks in bash (with the checkout's
bin/fp16audit on PATH, and its fixtures/ and the training logs of
internal/trainlog/testdata linked into the folder), and a block with a title (```yaml
title=".pre-commit-config.yaml") is written to that file first. Blocks in
other languages (console, text) are output, and are not run. A snippet
that stops working fails this test, and with it `make test` and `make
test-torch2`: on each leg, the pages whose libraries the leg has (the
`<!-- needs: fastai pre_commit -->` line of a page) run.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import unittest

import support

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")
PAGES = [os.path.join("docs", d, f) for d in ("tutorials", "guide")
         for f in sorted(os.listdir(os.path.join(ROOT, "docs", d))) if f.endswith(".md") and f != "index.md"]

_FENCE = re.compile(r'^(`{3,})(\w+)?(?:\s+title="([^"]+)")?\s*$')
_NEEDS = re.compile(r"<!--\s*needs:([^>]*)-->")

# What the driver does with the blocks, in a fresh interpreter.
_DRIVER = r'''
import json, os, subprocess, sys
blocks = json.load(open(sys.argv[1]))
g = {"__name__": "__main__"}
for i, b in enumerate(blocks):
    if b["title"]:
        with open(b["title"], "w") as f:
            f.write(b["code"])
        continue
    print("--- block %d (%s, line %d)" % (i, b["lang"], b["line"]), flush=True)
    if b["lang"] == "python":
        exec(compile(b["code"], "%s:%d" % (b["page"], b["line"]), "exec"), g)
    else:
        subprocess.run(["bash", "-euo", "pipefail", "-c", b["code"]], check=True)
    sys.stdout.flush()
'''


def blocks(page):
    """The page's code blocks: (lang, code, title, line) of each python,
    sh or titled block, and the modules the page needs."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, needs, i = [], [], 0
    while i < len(lines):
        m = _NEEDS.search(lines[i])
        if m:
            needs += m.group(1).split()
        m = _FENCE.match(lines[i].strip())
        if not m or not m.group(2):
            i += 1
            continue
        ticks, lang, title, start = m.group(1), m.group(2), m.group(3), i + 1
        indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != ticks:
            body.append(lines[i][len(indent):])
            i += 1
        i += 1
        if title or lang in ("python", "sh"):
            out.append({"lang": lang, "code": "\n".join(body) + "\n", "title": title, "line": start + 1, "page": page})
    return out, needs


class TutorialTest(support.TempDirMixin, unittest.TestCase):
    def run_page(self, page):
        code, needs = blocks(page)
        self.assertTrue(code, "%s has no code to run" % page)
        missing = [n for n in needs if importlib.util.find_spec(n) is None]
        if missing:
            msg = "%s needs %s, which %s lacks" % (page, ", ".join(missing), sys.executable)
            # CI runs every page: the CI gate's pre-commit is pinned for the
            # torch 1.13 leg only (python/requirements-test.txt)
            torch2 = os.environ.get("FP16AUDIT_TEST_LEG") == "torch2"
            if os.environ.get("CI") and not (torch2 and missing == ["pre_commit"]):
                raise AssertionError(msg)
            raise unittest.SkipTest(msg)
        # the commands of the guide name the repository's fixtures
        os.symlink(os.path.join(ROOT, "fixtures"), self.path("fixtures"))
        os.makedirs(self.path("internal/trainlog"))
        os.symlink(os.path.join(ROOT, "internal", "trainlog", "testdata"), self.path("internal/trainlog/testdata"))
        with open(self.path("_blocks.json"), "w") as f:
            json.dump(code, f)
        env = dict(os.environ)
        env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
        # the leg's interpreter first: `python` in a block is this one
        bindir = self.path("_bin")
        os.makedirs(bindir)
        os.symlink(sys.executable, os.path.join(bindir, "python"))
        env["PATH"] = os.pathsep.join([bindir, os.path.join(ROOT, "bin"), os.path.dirname(sys.executable), env.get("PATH", "")])
        env["PRE_COMMIT_HOME"] = self.path("_pre-commit")
        env["GITHUB_STEP_SUMMARY"] = self.path("_summary.md")
        # the CI gate's pre-commit config names this checkout's hooks
        # (.pre-commit-hooks.yaml at its last commit)
        env["FP16AUDIT_REPO"] = ROOT
        env["FP16AUDIT_REV"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                              check=True).stdout.strip()
        for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
            env.pop(k, None)
        env.update(GIT_AUTHOR_NAME="Tutorial", GIT_AUTHOR_EMAIL="tutorial@example.com",
                   GIT_COMMITTER_NAME="Tutorial", GIT_COMMITTER_EMAIL="tutorial@example.com", HOME=self.tmp)
        p = subprocess.run([sys.executable, "-c", _DRIVER, self.path("_blocks.json")], cwd=self.tmp, env=env,
                           capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            self.fail("%s stopped working (exit %d):\n%s\n%s" % (page, p.returncode, p.stdout[-6000:], p.stderr[-6000:]))
        return p.stdout


def _make(page):
    def test(self):
        self.run_page(page)
    test.__doc__ = "%s runs as written" % page
    return test


for _page in PAGES:
    setattr(TutorialTest, "test_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(_page))[0]), _make(_page))


if __name__ == "__main__":
    unittest.main()
