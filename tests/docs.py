"""Every example of README.md and docs/*.md works (`make test-docs`, part of
`make test`; Python standard library only).

- Each fenced ```nginx block goes through the project's own `nginx -t`
  with the module built by `make module`, and must pass without a
  warning. A complete configuration (one
  with `events`) runs as it stands, in a scratch prefix of its own with
  `modules/` linked to the built module and the files it names made
  beside it: its `sluice_quotas` file from the document's quota block of
  that name, token and secret files with fresh random contents (an
  absolute path of one of those is moved into the scratch directory: it
  cannot be written here). A fragment (a `location`, a `server`, a few
  directives) is first wrapped in a minimal configuration: http-level
  directives at http level, `location` and `server` blocks where they
  belong, anything else in `location /`, an upstream for every
  `proxy_pass http://name` the fragment does not define, and the
  document's quota block before it as `sluice_quotas`.
- Each fenced quota file is applied whole to a real `sluice root` (SQLite
  in a scratch directory) with `sluice quota apply -f ... --prune`, must be
  accepted, and every quota it names must then be at the root.
- Every relative link (and image) points to a file of the repository,
  and to a heading of it when the link names an anchor; every docs/*.md
  is linked from README.md or docs/README.md.

Markers, written in a fence's info string after the language (GitHub and
other renderers read only the first word):

    ```json quotas=quotas.json   a quota file; the name is what a config's
                                 `sluice_quotas` in the same document calls it
    ```toml quotas               a quota file without a name
    ```nginx seed=quotas.json    the quota block of that name seeds the
                                 wrapped fragment (default: the nearest
                                 quota block above it)
    ```nginx skip: <reason>      not run; the reason is required

A ```json or ```toml block that holds a top-level "quotas" list must be
marked `quotas` (or `skip: <reason>`), so that no quota file goes
untested. The last tests feed broken copies of the documents to the same
checks, to show that a renamed directive, a broken quota file and a
broken link are caught.
"""

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import tomllib
import unittest
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NGINX = REPO / "build/nginx/sbin/nginx"
MODULE_DIR = REPO / "build/nginx/modules"
SLUICE = REPO / "target/release/sluice"

# Directives that only the http block takes (sluice's from
# src/nginx/module.rs, and nginx's own that the documents use).
HTTP_ONLY = {
    "sluice_zone", "sluice_root", "sluice_quotas", "sluice_sync_interval",
    "sluice_sync_timeout", "sluice_in_flight_lease", "sluice_sync_token_file",
    "sluice_host_id", "sluice_sync_early", "sluice_keys", "sluice_key_overflow",
    "sluice_key_secret_file", "sluice_overrides",
    "map", "upstream", "log_format", "geo", "split_clients", "server",
}
# Directives of the main context.
MAIN_ONLY = {"load_module", "events", "http", "env", "worker_processes", "pid",
             "error_log", "worker_shutdown_timeout", "thread_pool", "stream"}
# Directives that name a file nginx reads while it parses the configuration.
FILE_DIRECTIVES = {"sluice_quotas", "sluice_sync_token_file", "sluice_key_secret_file"}


def documents():
    """README.md and docs/*.md, as paths relative to the repository."""
    return [Path("README.md")] + sorted(p.relative_to(REPO) for p in (REPO / "docs").glob("*.md"))


# --- Markdown ----------------------------------------------------------------

class Block:
    """A fenced code block: its language, markers and text, and where it starts."""

    def __init__(self, doc, line, info, text):
        self.doc, self.line, self.text = doc, line, text
        words = info.split(None, 1)
        self.lang = words[0] if words else ""
        rest = words[1].strip() if len(words) > 1 else ""
        self.skip = None
        self.quotas = None  # None: not a quota file; "": one without a name
        self.seed = None
        if rest.startswith("skip"):
            self.skip = rest[len("skip"):].lstrip(":").strip()
            rest = ""
        for word in rest.split():
            key, _, value = word.partition("=")
            if key == "quotas":
                self.quotas = value
            elif key == "seed":
                self.seed = value
            else:
                self.bad_marker = word

    bad_marker = None

    def __repr__(self):
        return f"{self.doc}:{self.line} ```{self.lang}"


def fenced_blocks(doc, text):
    """The fenced code blocks of a Markdown text."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})(.*)$", lines[i])
        if not m:
            i += 1
            continue
        fence, info, start, body = m[1], m[2].strip(), i + 1, []
        i += 1
        while i < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        blocks.append(Block(doc, start, info, "\n".join(body) + "\n"))
        i += 1
    return blocks


def prose(text, spans=True):
    """The text outside fenced blocks, line numbers kept; code spans are
    blanked too unless `spans` is False (a link inside code is no link)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m[1]
            out.append("")
        elif fence is not None:
            if re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", line):
                fence = None
            out.append("")
        else:
            out.append(re.sub(r"`[^`\n]*`", lambda s: "x" * len(s[0]), line) if spans else line)
    return out


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text):
    """Every anchor of a Markdown text's headings (repeats get -1, -2...)."""
    seen, out = {}, set()
    for line in prose(text, spans=False):
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m[1])
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text):
    """(line number, target) of every link and image of a Markdown text
    outside code, inline or by reference."""
    out = []
    for number, line in enumerate(prose(text), 1):
        for target in re.findall(r"\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            out.append((number, target))
        for target in re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", line):
            out.append((number, target))
    return out


def relative(target):
    """False for a link with a scheme (http:, mailto:)."""
    return not re.match(r"[a-zA-Z][a-zA-Z+.-]*:", target)


def link_problems(doc, text):
    """Relative links of `text` (the document `doc`) to a missing file or
    anchor, or out of the repository."""
    problems, repo = [], REPO.resolve()
    here = REPO / doc
    for number, target in links(text):
        if not relative(target):
            continue
        path, _, anchor = target.partition("#")
        where = f"{doc}:{number}: {target}"
        file = (here.parent / path).resolve() if path else here.resolve()
        if repo not in (file, *file.parents):
            problems.append(f"{where}: leaves the repository")
        elif not file.exists():
            problems.append(f"{where}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            problems.append(f"{where}: no heading #{anchor} in {file.relative_to(repo)}")
    return problems


def linked_pages(doc):
    """The files the relative links of a document reach."""
    here = (REPO / doc).parent
    return {(here / t.partition("#")[0]).resolve() for _, t in links(read(doc))
            if relative(t) and t.partition("#")[0]}


def unmarked_quota_files(blocks):
    """JSON and TOML blocks that hold a quota set but are not marked."""
    problems = []
    for block in blocks:
        if block.lang not in ("json", "toml") or block.quotas is not None or block.skip is not None:
            continue
        try:
            data = json.loads(block.text) if block.lang == "json" else tomllib.loads(block.text)
        except ValueError:
            continue
        quotas = data.get("quotas") if isinstance(data, dict) else data
        if isinstance(quotas, list) and all(isinstance(q, dict) and "name" in q for q in quotas):
            problems.append(f"{block!r} holds quotas: mark it `quotas` (or `skip: why`)")
    return problems


# --- nginx configurations ------------------------------------------------------

class Statement:
    """A top-level statement of an nginx configuration: its name, its
    words before `;` or `{`, its text and its block's text (None for a
    simple statement)."""

    def __init__(self, words, text, body):
        self.name = words[0] if words else ""
        self.words, self.text, self.body = words, text, body


def statements(conf):
    """The top-level statements of a configuration (comments dropped from
    their words). Knows nginx's quotes, escapes and `${var}` in a word."""
    out, i, n = [], 0, len(conf)
    depth, start, body, words, word = 0, None, None, [], ""

    def end_word():
        nonlocal word
        if word and depth == 0:
            words.append(word)
        word = ""

    def end_statement(end):
        nonlocal start, body, words
        out.append(Statement(words, conf[start:end], conf[body:end - 1] if body else None))
        start, body, words = None, None, []

    while i < n:
        c = conf[i]
        if c == "#" and not word:
            while i < n and conf[i] != "\n":
                i += 1
            continue
        if start is None and not c.isspace():
            start = i
        if c in "\"'" and not word:
            j = i + 1
            while j < n and conf[j] != c:
                j += 2 if conf[j] == "\\" else 1
            if j >= n:
                raise ValueError("a quote is not closed")
            word, i = conf[i + 1:j] or '""', j + 1
            continue
        if c == "\\" and i + 1 < n:
            word += conf[i:i + 2]
            i += 2
            continue
        if c == "$" and conf.startswith("{", i + 1):
            j = conf.find("}", i)
            if j < 0:
                raise ValueError("a ${ is not closed")
            word += conf[i:j + 1]
            i = j + 1
            continue
        if c.isspace():
            end_word()
        elif c == ";":
            end_word()
            if depth == 0:
                end_statement(i + 1)
        elif c == "{":
            end_word()
            if depth == 0:
                body = i + 1
            depth += 1
        elif c == "}":
            end_word()
            depth -= 1
            if depth < 0:
                raise ValueError("a } closes nothing")
            if depth == 0:
                end_statement(i + 1)
        else:
            word += c
        i += 1
    end_word()
    if depth or words:
        raise ValueError("the configuration ends inside a statement")
    return out


def is_complete(conf):
    return any(s.name == "events" for s in statements(conf))


def wrap(fragment, seed):
    """A whole configuration around `fragment`; `seed` is the file name of
    the quota file to seed it with, or None."""
    parts = statements(fragment)
    names = {s.name for s in parts}
    main = [s.text for s in parts if s.name in MAIN_ONLY]
    if "load_module" not in names:
        main.insert(0, "load_module modules/ngx_http_sluice_module.so;")
    if "http" in names:
        return "\n".join(main + ["events {}", ""])
    http = [s.text for s in parts if s.name in HTTP_ONLY]
    inner = [s.text for s in parts if s.name not in HTTP_ONLY | MAIN_ONLY]
    if seed and "sluice_quotas" not in names:
        http.insert(0, f"sluice_quotas {seed};")
    defined = {s.words[1] for s in parts if s.name == "upstream" and len(s.words) > 1}
    for upstream in sorted(set(re.findall(r"proxy_pass\s+https?://([A-Za-z_][\w-]*)\s*;", fragment)) - defined):
        http.append(f"upstream {upstream} {{ server 127.0.0.1:9; }}")
    if inner:
        if not {"location", "server"} & names:
            inner = ["location / {"] + inner + ["}"]
        http.append("server {\n" + "\n".join(inner) + "\n}")
    return "\n".join(main + ["events {}", "http {"] + http + ["}", ""])


def files_named(conf):
    """(directive, path) of every file the configuration reads while parsed."""
    found = []

    def walk(text):
        for s in statements(text):
            if s.name in FILE_DIRECTIVES and len(s.words) > 1:
                found.append((s.name, s.words[1]))
            if s.body is not None and s.name not in ("map", "types", "geo", "split_clients"):
                walk(s.body)

    walk(conf)
    return found


def nginx_t(conf, quota_texts, work):
    """Runs our nginx -t on `conf` in the scratch directory `work` (its
    prefix): the files the configuration reads are made there first
    (`quota_texts` maps a quota file name to its text). Returns nginx's
    complaint (an error or a warning), or None."""
    (work / "logs").mkdir(parents=True)
    (work / "modules").symlink_to(MODULE_DIR)
    for directive, name in files_named(conf):
        if os.path.isabs(name):
            # Only the scratch directory can be written: the same file
            # name, there.
            conf = re.sub(rf"(\b{directive}\s+){re.escape(name)}\s*;", rf"\g<1>{Path(name).name};", conf)
            name = Path(name).name
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if directive == "sluice_quotas":
            text = quota_texts.get(name)
            if text is None and (REPO / "nginx-conf" / name).exists():
                text = (REPO / "nginx-conf" / name).read_text()
            if text is None:
                return f"it names the quota file {name}: no quota block is marked quotas={name}"
            path.write_text(text)
        else:
            path.write_text(secrets.token_hex(32) + "\n")
    (work / "nginx.conf").write_text(conf)
    # -q: only warnings and errors are printed, and an example should
    # have neither.
    result = subprocess.run([str(NGINX), "-t", "-q", "-p", f"{work}/", "-c", "nginx.conf"],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0 or result.stderr.strip():
        return (result.stderr.strip() or f"nginx -t exited {result.returncode}") + "\n--- tested as:\n" + conf
    return None


def quota_texts_of(blocks):
    return {b.quotas: b.text for b in blocks if b.quotas}


def seed_for(block, blocks):
    """The quota block that seeds a fragment: its `seed=`, else the nearest
    quota block above it in its document."""
    quota_blocks = [b for b in blocks if b.quotas is not None and b.lang == "json"]
    if block.seed:
        return next((b for b in quota_blocks if b.quotas == block.seed), None)
    above = [b for b in quota_blocks if b.line < block.line]
    return above[-1] if above else None


def nginx_block_problem(block, blocks, work):
    """What is wrong with an nginx block (None when nginx -t accepts it)."""
    try:
        complete = is_complete(block.text)
        if complete:
            conf = block.text
            texts = quota_texts_of(blocks)
        else:
            seed = seed_for(block, blocks)
            if block.seed and seed is None:
                return f"seed={block.seed}: no quota block of that name"
            conf = wrap(block.text, "seed.json" if seed else None)
            texts = {"seed.json": seed.text} if seed else {}
    except ValueError as e:
        return f"cannot read it as nginx configuration: {e}"
    return nginx_t(conf, texts, work)


# --- a quota root --------------------------------------------------------------

def end(process, grace):
    """Stops `process`: SIGTERM, then SIGKILL if it still runs after
    `grace` seconds."""
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Root:
    """A real `sluice root` on a free loopback port, SQLite in `work`."""

    def __init__(self, work):
        self.token = work / "admin.token"
        self.token.write_text(secrets.token_hex(32) + "\n")
        self.log = open(work / "root.log", "w")
        # The port is free when picked, and may be taken before the root
        # binds it: a root that exits at once is tried on another.
        for _ in range(3):
            self.url = f"http://127.0.0.1:{free_port()}"
            self.process = subprocess.Popen(
                [str(SLUICE), "root", "--listen", self.url.removeprefix("http://"),
                 "--db", f"sqlite://{work}/quotas.db", "--admin-token-file", str(self.token)],
                stdout=self.log, stderr=subprocess.STDOUT)
            if self.answers(deadline=time.monotonic() + 30):
                return
        self.log.close()
        raise RuntimeError(f"the root did not start: {(work / 'root.log').read_text()}")

    def answers(self, deadline):
        """Waits until /healthz answers (True) or the root exits or the
        deadline passes (False)."""
        while self.process.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2):
                    return True
            except OSError:
                time.sleep(0.1)
        end(self.process, 0)
        return False

    def cli(self, *args):
        return subprocess.run([str(SLUICE), "quota", *args, "--root", self.url,
                               "--token-file", str(self.token)],
                              capture_output=True, text=True, timeout=60)

    def stop(self):
        end(self.process, 10)
        self.log.close()


def quota_names(block):
    data = json.loads(block.text) if block.lang == "json" else tomllib.loads(block.text)
    quotas = data["quotas"] if isinstance(data, dict) else data
    return {q["name"] for q in quotas}


def quota_block_problem(block, root, work):
    """What is wrong with a quota file (None when the root takes it whole)."""
    if block.lang not in ("json", "toml"):
        return f"a quota file must be json or toml, not {block.lang!r}"
    path = work / f"quotas.{block.lang}"
    path.write_text(block.text)
    applied = root.cli("apply", "-f", str(path), "--prune")
    if applied.returncode != 0:
        return f"sluice quota apply refused it: {applied.stderr.strip() or applied.stdout.strip()}"
    listed = root.cli("list", "--all", "--json")
    if listed.returncode != 0:
        return f"sluice quota list failed: {listed.stderr.strip()}"
    have = {q["name"] for q in json.loads(listed.stdout)["quotas"]}
    missing = quota_names(block) - have
    return f"applied, but the root lacks {sorted(missing)}" if missing else None


# --- the tests -----------------------------------------------------------------

def read(doc):
    return (REPO / doc).read_text()


def all_blocks():
    return {doc: fenced_blocks(doc, read(doc)) for doc in documents()}


class Scratch(unittest.TestCase):
    """A scratch directory per test, removed afterwards."""

    def setUp(self):
        self.work = Path(tempfile.mkdtemp(prefix="sluice-docs-"))
        self.addCleanup(shutil.rmtree, self.work, True)

    def scratch(self, name):
        path = self.work / name
        path.mkdir()
        return path


class Built(Scratch):
    @classmethod
    def setUpClass(cls):
        for path, target in ((NGINX, "nginx"), (MODULE_DIR / "ngx_http_sluice_module.so", "module"),
                             (SLUICE, "bin")):
            if not path.exists():
                raise RuntimeError(f"{path} is missing: run make {target} first")


class Examples(Built):
    def test_every_nginx_block_passes_nginx_t(self):
        count = 0
        for doc, blocks in all_blocks().items():
            for i, block in enumerate(blocks):
                if block.lang != "nginx" or block.skip is not None:
                    continue
                count += 1
                with self.subTest(block=repr(block)):
                    self.assertIsNone(nginx_block_problem(block, blocks, self.scratch(f"{doc.stem}-{i}")))
        self.assertGreaterEqual(count, 8, "the nginx blocks were not found")

    def test_every_linked_example_configuration_passes_nginx_t(self):
        """The nginx-conf/ files the documents link, as they stand, with
        their quota files from nginx-conf/."""
        confs = sorted({p for doc in documents() for p in linked_pages(doc) if p.suffix == ".conf"})
        for conf in confs:
            with self.subTest(conf=conf.name):
                self.assertIsNone(nginx_t(conf.read_text(), {}, self.scratch(conf.stem)))
        self.assertGreaterEqual(len(confs), 8, "the example configurations were not found")

    def test_every_quota_file_is_accepted_by_a_root(self):
        root = Root(self.scratch("root"))
        self.addCleanup(root.stop)
        count = 0
        for doc, blocks in all_blocks().items():
            for block in blocks:
                if block.quotas is None or block.skip is not None:
                    continue
                count += 1
                with self.subTest(block=repr(block)):
                    self.assertIsNone(quota_block_problem(block, root, self.work))
        self.assertGreaterEqual(count, 5, "the quota blocks were not found")


class Documents(unittest.TestCase):
    def test_every_relative_link_reaches_a_file_and_heading(self):
        for doc in documents():
            with self.subTest(doc=str(doc)):
                self.assertEqual([], link_problems(doc, read(doc)))

    def test_every_docs_page_is_linked_from_an_index(self):
        linked = linked_pages(Path("README.md")) | linked_pages(Path("docs/README.md"))
        for doc in documents()[1:]:
            with self.subTest(doc=str(doc)):
                self.assertIn((REPO / doc).resolve(), linked, "neither README.md nor docs/README.md links it")

    def test_every_quota_file_is_marked_and_every_skip_says_why(self):
        for doc, blocks in all_blocks().items():
            with self.subTest(doc=str(doc)):
                self.assertEqual([], unmarked_quota_files(blocks))
                for block in blocks:
                    self.assertIsNone(block.bad_marker, f"{block!r}: unknown marker")
                    if block.skip is not None:
                        self.assertTrue(block.skip, f"{block!r}: skip without a reason")

    def test_the_readme_is_an_entry_of_at_most_300_lines(self):
        self.assertLessEqual(read("README.md").count("\n"), 300)


# --- the checks catch what they are for -----------------------------------------

def quick_start(blocks, lang):
    """The README's quick start block of a language (the first one after
    the quick start's heading)."""
    text = read("README.md")
    heading = text.index("## Quick start")
    line = text[:heading].count("\n") + 1
    return next(b for b in blocks if b.lang == lang and b.line > line)


class Breakage(Built):
    def test_a_renamed_directive_fails(self):
        blocks = fenced_blocks(Path("README.md"), read("README.md"))
        block = quick_start(blocks, "nginx")
        self.assertIsNone(nginx_block_problem(block, blocks, self.scratch("as-shipped")))
        self.assertIn("sluice_headers", block.text)
        block.text = block.text.replace("sluice_headers", "sluice_header")
        problem = nginx_block_problem(block, blocks, self.scratch("renamed"))
        self.assertIn('unknown directive "sluice_header"', problem or "")

    def test_a_broken_fragment_fails(self):
        doc = Path("docs/nginx.md")
        blocks = fenced_blocks(doc, "```nginx\nlocation / { sluice api weight=abc; }\n```\n")
        problem = nginx_block_problem(blocks[0], blocks, self.scratch("fragment"))
        self.assertIn("weight", problem or "")

    def test_a_quota_file_the_root_refuses_fails(self):
        root = Root(self.scratch("root"))
        self.addCleanup(root.stop)
        block = quick_start(fenced_blocks(Path("README.md"), read("README.md")), "json")
        self.assertIsNone(quota_block_problem(block, root, self.work))
        block.text = re.sub(r'"limit": \d+', '"limit": "ten"', block.text, count=1)
        self.assertIn("refused", quota_block_problem(block, root, self.work) or "")

    def test_a_quota_file_the_config_names_but_no_block_has_fails(self):
        blocks = fenced_blocks(Path("README.md"), read("README.md"))
        block = quick_start(blocks, "nginx")
        others = [b for b in blocks if b.quotas is None]
        self.assertIn("no quota block is marked",
                      nginx_block_problem(block, others, self.scratch("unseeded")) or "")


class Readers(unittest.TestCase):
    """The Markdown and nginx readers, without nginx or a root."""

    def test_a_fragment_is_wrapped_where_its_directives_belong(self):
        conf = wrap("sluice_key_secret_file /k;\n"
                    "location /a { sluice q key=$http_x_key; proxy_pass http://app; }\n", "seed.json")
        http = statements(statements(conf)[-1].body)
        self.assertEqual(["sluice_quotas", "sluice_key_secret_file", "upstream", "server"],
                         [s.name for s in http])
        self.assertEqual(["location"], [s.name for s in statements(http[-1].body)])

    def test_loose_directives_go_in_a_location(self):
        conf = wrap("sluice q weight=$w;\nproxy_pass http://app;\n", None)
        server = statements(statements(conf)[-1].body)[-1]
        self.assertEqual(["location"], [s.name for s in statements(server.body)])
        self.assertNotIn("sluice_quotas", conf)

    def test_a_complete_configuration_is_told_from_a_fragment(self):
        self.assertTrue(is_complete("events {}\nhttp { }\n"))
        self.assertFalse(is_complete("location / { sluice events; }\n"))

    def test_words_keep_variables_quotes_and_comments_apart(self):
        # As in nginx, a quote opens a word only at its start.
        parts = statements('sluice s3_${b}_${rw} "key=$a b" x="y; # sluice x;\n'
                           "return 200 '{\"ok\": 1}'; location / { }\n")
        self.assertEqual([["sluice", "s3_${b}_${rw}", "key=$a b", 'x="y'], ["return", "200", '{"ok": 1}'],
                          ["location", "/"]], [s.words for s in parts])
        self.assertEqual(" ", parts[-1].body)

    def test_the_files_a_configuration_reads_are_found_at_any_depth(self):
        self.assertEqual([("sluice_quotas", "q.json"), ("sluice_sync_token_file", "/etc/s.token")],
                         files_named("http { sluice_quotas q.json; server { } }\n"
                                     "sluice_sync_token_file /etc/s.token;\n"))


    def test_a_missing_file_or_heading_is_caught(self):
        text = read("README.md")
        for link, problem in (("[x](docs/no-such-page.md)", "no such file"),
                              ("[x](docs/nginx.md#no-such-heading)", "no heading #no-such-heading"),
                              ("[x](#no-such-heading)", "no heading #no-such-heading"),
                              ("[x](../../outside.md)", "leaves the repository")):
            with self.subTest(link=link):
                problems = link_problems(Path("README.md"), text + "\n" + link + "\n")
                self.assertTrue(any(problem in p for p in problems), problems)

    def test_a_link_in_code_is_no_link(self):
        self.assertEqual([], link_problems(Path("README.md"), "`[x](nope.md)`\n```\n[x](nope.md)\n```\n"))

    def test_an_unmarked_quota_file_is_caught(self):
        for text in ('{"quotas": [{"name": "a", "limit": 1}]}', '[{"name": "a", "limit": 1}]'):
            blocks = fenced_blocks(Path("x.md"), f"```json\n{text}\n```\n")
            self.assertEqual(1, len(unmarked_quota_files(blocks)), text)
        blocks = fenced_blocks(Path("x.md"), '```json\n{"status": "ok", "quotas": 6}\n```\n')
        self.assertEqual([], unmarked_quota_files(blocks))

    def test_anchors_follow_githubs_rules(self):
        self.assertEqual("console-and-sluice-top", slug("Console and `sluice top`"))
        self.assertEqual("bindings-python-luajit-go", slug("Bindings: Python, LuaJIT, Go"))
        self.assertEqual({"a", "a-1"}, anchors("# A\n## A\n```\n# not a heading\n```\n"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
