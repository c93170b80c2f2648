"""mkdocs hook: a Markdown link from a page to a file of the repository
outside docs/ (a source file, an example, python/README.md) becomes the
file's path in code type, since the site does not serve those files;
a link to a repository file that does not exist fails the build, as a
broken link between pages does."""

import os
import re

from mkdocs.exceptions import PluginError

_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")
_FENCE = re.compile(r"^(```|~~~)")


def on_page_markdown(markdown, page, config, files):
    docs_dir = os.path.realpath(config["docs_dir"])
    root = os.path.dirname(docs_dir)
    page_dir = os.path.dirname(os.path.join(docs_dir, page.file.src_path))
    out, in_fence = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line.lstrip()):
            in_fence = not in_fence
        if not in_fence:
            line = _LINK.sub(lambda m: _rewrite(m, page_dir, docs_dir, root, page.file.src_path), line)
        out.append(line)
    return "\n".join(out)


def _rewrite(m, page_dir, docs_dir, root, src):
    text, target = m.group(1), m.group(2)
    if "://" in target or target.startswith("mailto:"):
        return m.group(0)
    path = os.path.realpath(os.path.join(page_dir, target))
    if path == docs_dir or path.startswith(docs_dir + os.sep):
        return m.group(0)
    if not path.startswith(root + os.sep):
        raise PluginError("%s: link %r leaves the repository" % (src, target))
    if not os.path.exists(path):
        raise PluginError("%s: link %r: no such file in the repository" % (src, target))
    shown = os.path.relpath(path, root)
    return text if text.strip("`") == shown else "%s (`%s`)" % (text, shown)
