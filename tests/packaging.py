"""The Dockerfile, deploy/docker-compose.yml and deploy/nginx.conf agree with
the Makefile (run by `make test-packaging`, part of `make test`).

There is no Docker engine on the development machines, so the image and the
compose file are never built or run here; these checks keep them from
drifting: the same nginx-src crate version and nginx configure flags as the
Makefile, runtime libraries for what the build links, and a compose fleet
whose services, ports, tokens and database URL fit together. Each check
returns a list of problems; the drift tests feed altered texts to show that
each kind of drift is caught.

Also here, as they concern what a fresh clone gets: which apt packages
`make run` and `make test` install (dry runs of the Makefile), and that
README.md names no path outside the repository.
"""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

# Flags that only place the build on this machine.
PATH_FLAGS = ("--prefix=", "--builddir=")

# Build-time -dev package -> the runtime library package that provides
# what nginx links from it (Debian 12).
RUNTIME_LIBRARY = {"libpcre2-dev": "libpcre2-8-0", "zlib1g-dev": "zlib1g", "libssl-dev": "libssl3"}


def read(relative):
    return (REPO / relative).read_text()


def make_variables(text):
    """`NAME := value` assignments, backslash continuations joined."""
    joined = re.sub(r"\\\n", " ", text)
    return {m[1]: " ".join(m[2].split())
            for m in re.finditer(r"^([A-Z_]+)\s*:?=\s*(.*)$", joined, re.M)}


def dockerfile_stages(text):
    """The stages' instructions: a list of (FROM line, [(INSTRUCTION, args)])."""
    joined = re.sub(r"\\\n", " ", text)
    stages = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stages.append((args, []))
        elif stages:
            stages[-1][1].append((instruction, " ".join(args.split())))
    return stages


def dockerfile_args(stages):
    args = {}
    for _, instructions in stages:
        for instruction, value in instructions:
            if instruction == "ARG" and "=" in value:
                name, _, default = value.partition("=")
                args[name] = " ".join(shlex.split(default))
    return args


def apt_installed(run_args):
    """Packages of the `apt-get install` in a RUN instruction."""
    words = shlex.split(run_args.replace("&&", " && "))
    if "install" not in words:
        return []
    out = []
    for word in words[words.index("install") + 1:]:
        if word == "&&":
            break
        if not word.startswith("-"):
            out.append(word)
    return out


def docker_problems(makefile, dockerfile):
    """How the Dockerfile disagrees with the Makefile."""
    problems = []
    make = make_variables(makefile)
    stages = dockerfile_stages(dockerfile)
    args = dockerfile_args(stages)
    if len(stages) < 2:
        return ["the Dockerfile should have a build stage and a runtime stage"]

    version = make.get("NGINX_SRC_CRATE_VERSION")
    if args.get("NGINX_SRC_CRATE_VERSION") != version:
        problems.append(f"nginx-src version: Makefile {version}, "
                        f"Dockerfile {args.get('NGINX_SRC_CRATE_VERSION')}")
    flags = [f for f in make.get("NGINX_CONFIGURE_ARGS", "").split() if not f.startswith(PATH_FLAGS)]
    docker_flags = args.get("NGINX_CONFIGURE_FLAGS", "").split()
    if docker_flags != flags:
        problems.append(f"configure flags: Makefile {flags}, Dockerfile {docker_flags}")

    build_runs = [v for i, v in stages[0][1] if i == "RUN"]
    make_runs = [r for r in build_runs if re.search(r"\bmake\b.*\bnginx module bin\b", r)]
    if not make_runs:
        problems.append("the build stage does not run `make ... nginx module bin`")
    elif 'NGINX_SRC_CRATE_VERSION="$NGINX_SRC_CRATE_VERSION"' not in make_runs[0]:
        problems.append("the build does not pass NGINX_SRC_CRATE_VERSION to make")
    elif "$NGINX_CONFIGURE_FLAGS" not in make_runs[0] or "nginx -V" not in make_runs[0]:
        problems.append("the build does not check NGINX_CONFIGURE_FLAGS in `nginx -V`")
    if not any("make deps-build" in r for r in build_runs):
        problems.append("the build stage does not install the Makefile's build packages (make deps-build)")

    runtime = [p for i, v in stages[-1][1] if i == "RUN" for p in apt_installed(v)]
    for dev in make.get("BUILD_PKGS", "").split():
        lib = RUNTIME_LIBRARY.get(dev)
        if lib and lib not in runtime:
            problems.append(f"the runtime image lacks {lib} (nginx links it: {dev} in BUILD_PKGS)")
    return problems


def nginx_directives(conf, name):
    """The arguments of every `name ...;` directive in an nginx config."""
    return [m[1].split() for m in re.finditer(rf"^\s*{name}\s+([^;]*);", conf, re.M)]


def compose_problems(compose_text, nginx_conf, dockerfile):
    """How deploy/docker-compose.yml and deploy/nginx.conf disagree with each
    other and with the Dockerfile."""
    problems = []
    compose = yaml.safe_load(compose_text)
    services = compose.get("services", {})
    roots = sorted(n for n in services if n.startswith("root-"))
    nginxes = sorted(n for n in services if n.startswith("nginx-"))
    if len(roots) != 2 or len(nginxes) != 2 or "postgres" not in services:
        problems.append(f"want two roots, two nginx and postgres; have {sorted(services)}")

    for name in roots + nginxes:
        build = services[name].get("build", {})
        if build.get("context") != ".." or build.get("dockerfile") != "Dockerfile":
            problems.append(f"{name} is not built from the repository's Dockerfile: {build}")
    dockerfile_exposes = set(" ".join(v for i, v in dockerfile_stages(dockerfile)[-1][1]
                                      if i == "EXPOSE").split())

    pg = services.get("postgres", {}).get("environment", {})
    want_db = f"postgres://{pg.get('POSTGRES_USER')}:{pg.get('POSTGRES_PASSWORD')}@postgres"
    root_ports = {}
    for name in roots:
        command = services[name].get("command", [])
        flags = dict(zip(command, command[1:]))
        if command[:2] != ["sluice", "root"]:
            problems.append(f"{name} does not run `sluice root`: {command}")
        db = flags.get("--db", "")
        if not db.startswith(want_db) or not db.endswith("/" + str(pg.get("POSTGRES_DB"))):
            problems.append(f"{name}'s --db {db} is not the postgres service's database")
        for flag, secret in (("--admin-token-file", "admin_token"), ("--sync-token-file", "sync_token")):
            if flags.get(flag) != f"/run/secrets/{secret}" or secret not in services[name].get("secrets", []):
                problems.append(f"{name}: {flag} should be the {secret} secret")
        port = flags.get("--listen", "").rpartition(":")[2]
        root_ports[name] = port
        if port not in dockerfile_exposes:
            problems.append(f"{name} listens on {port}, the Dockerfile exposes {sorted(dockerfile_exposes)}")
        if services[name].get("depends_on", {}).get("postgres", {}).get("condition") != "service_healthy":
            problems.append(f"{name} should wait for a healthy postgres")

    conf_roots = [u for args in nginx_directives(nginx_conf, "sluice_root") for u in args]
    want_roots = [f"http://{n}:{root_ports[n]}" for n in roots]
    if conf_roots != want_roots:
        problems.append(f"nginx.conf's sluice_root {conf_roots}, the compose roots {want_roots}")
    token = nginx_directives(nginx_conf, "sluice_sync_token_file")
    if token != [["/run/secrets/sync_token"]]:
        problems.append(f"nginx.conf's sluice_sync_token_file {token} is not the sync_token secret")

    listens = {args[0] for args in nginx_directives(nginx_conf, "listen")}
    for name in nginxes:
        service = services[name]
        mounts = service.get("volumes", [])
        conf_path = service.get("command", [None, None, ""])[2]
        if f"./nginx.conf:{conf_path}:ro" not in mounts:
            problems.append(f"{name} does not run the mounted nginx.conf: {service.get('command')}, {mounts}")
        if "sync_token" not in service.get("secrets", []):
            problems.append(f"{name} lacks the sync_token secret")
        for mapping in service.get("ports", []):
            container_port = str(mapping).rpartition(":")[2]
            if container_port not in listens:
                problems.append(f"{name} publishes {container_port}; nginx.conf listens on {sorted(listens)}")

    for secret in compose.get("secrets", {}).values():
        if not secret.get("file", "").endswith(".token"):
            problems.append(f"secret file {secret} is not a *.token file (.gitignore keeps those out of git)")
    return problems


# --- the files in the repository -------------------------------------------

def test_the_dockerfile_builds_the_makefiles_nginx():
    assert docker_problems(read("Makefile"), read("Dockerfile")) == []


def test_the_compose_fleet_fits_together():
    assert compose_problems(read("deploy/docker-compose.yml"), read("deploy/nginx.conf"),
                            read("Dockerfile")) == []


@pytest.mark.parametrize("conf_file", ["deploy/nginx.conf", "nginx-conf/docker.conf"])
def test_the_images_nginx_confs_pass_nginx_t(tmp_path, conf_file):
    """Our nginx and module accept the compose fleet's and the image's nginx
    configurations (paths moved into a scratch prefix; root host names are
    not resolved by -t)."""
    nginx = REPO / "build/nginx/sbin/nginx"
    module = REPO / "build/nginx/modules/ngx_http_sluice_module.so"
    if not (nginx.exists() and module.exists()):
        pytest.fail("build nginx and the module first (make nginx module)")
    for d in ("conf", "logs", "html"):
        (tmp_path / d).mkdir()
    shutil.copy(REPO / "nginx-conf/standalone-quotas.json", tmp_path / "conf/quotas.json")
    (tmp_path / "sync.token").write_text("token\n")
    conf = read(conf_file)
    conf = conf.replace("load_module modules/ngx_http_sluice_module.so;", f"load_module {module};")
    conf = conf.replace("/run/secrets/sync_token", str(tmp_path / "sync.token"))
    (tmp_path / "conf/fleet.conf").write_text(conf)
    result = subprocess.run([str(nginx), "-t", "-p", f"{tmp_path}/", "-c", f"{tmp_path}/conf/fleet.conf"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# --- drift is caught ---------------------------------------------------------

@pytest.mark.parametrize("old, new, problem", [
    ("NGINX_SRC_CRATE_VERSION := 1.28.5+1.28.3", "NGINX_SRC_CRATE_VERSION := 1.30.0+1.30.0",
     "nginx-src version"),
    ("\t--with-stream\n", "\t--with-stream \\\n\t--with-http_gzip_static_module\n", "configure flags"),
    ("\t--with-threads \\\n", "", "configure flags"),
])
def test_a_makefile_change_the_dockerfile_does_not_follow_is_caught(old, new, problem):
    makefile = read("Makefile")
    assert old in makefile
    problems = docker_problems(makefile.replace(old, new), read("Dockerfile"))
    assert any(p.startswith(problem) for p in problems), problems


@pytest.mark.parametrize("old, new, problem", [
    ("libssl3 ", "", "the runtime image lacks libssl3"),
    ('NGINX_SRC_CRATE_VERSION="$NGINX_SRC_CRATE_VERSION"', "", "the build does not pass"),
    ("nginx -V", "nginx -v", "the build does not check"),
])
def test_a_dockerfile_change_is_caught(old, new, problem):
    dockerfile = read("Dockerfile")
    assert old in dockerfile
    problems = docker_problems(read("Makefile"), dockerfile.replace(old, new))
    assert any(p.startswith(problem) for p in problems), problems


@pytest.mark.parametrize("old, new, problem", [
    ("  root-b:\n", "  root-c:\n", "nginx.conf's sluice_root"),
    ("@postgres:5432/sluice", "@db:5432/sluice", "root-a's --db"),
    ("POSTGRES_PASSWORD: sluice", "POSTGRES_PASSWORD: other", "root-a's --db"),
    ("0.0.0.0:7070", "0.0.0.0:9000", "root-a listens on 9000"),
    ("127.0.0.1:8081:8080", "127.0.0.1:8081:80", "nginx-b publishes 80"),
    ("  secrets: [sync_token]\n", "", "nginx-a lacks the sync_token secret"),
])
def test_a_compose_change_is_caught(old, new, problem):
    compose = read("deploy/docker-compose.yml")
    assert old in compose
    problems = compose_problems(compose.replace(old, new), read("deploy/nginx.conf"), read("Dockerfile"))
    assert any(p.startswith(problem) for p in problems), problems


def test_an_nginx_conf_with_other_roots_is_caught():
    conf = read("deploy/nginx.conf").replace("http://root-b:7070", "http://root-b:7071")
    problems = compose_problems(read("deploy/docker-compose.yml"), conf, read("Dockerfile"))
    assert any(p.startswith("nginx.conf's sluice_root") for p in problems), problems


# --- which target installs what ----------------------------------------------

def packages_installed_by(target):
    """The apt packages `make <target>` installs when they are missing,
    read from a dry run (`make -n` still runs the recursive `$(MAKE)
    install-pkgs`, itself dry, which shows its package list)."""
    result = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    packages = set()
    for listed in re.findall(r"\bfor p in ([^;]*);", result.stdout):
        packages.update(listed.split())
    return packages


def test_make_run_installs_only_what_the_demo_needs():
    """`make run` installed 25 packages (Chromium, PostgreSQL, Prometheus,
    wrk...) before a demo that needs none of them."""
    variables = make_variables(read("Makefile"))
    run = packages_installed_by("run")
    assert run == set(variables["BUILD_PKGS"].split()) | set(variables["RUN_PKGS"].split())
    for heavy in ("chromium", "postgresql", "prometheus", "wrk", "redis-server", "golang-go"):
        assert heavy not in run
    # What demo.sh runs beyond coreutils and the build.
    assert {"curl", "procps"} <= run


def test_make_test_still_installs_everything():
    """CI (.ci/run: make deps, then make test) starts from a fresh machine."""
    variables = make_variables(read("Makefile"))
    everything = set()
    for name in ("BUILD_PKGS", "RUN_PKGS", "TEST_PKGS", "OPS_PKGS", "FAULT_PKGS", "BINDING_PKGS"):
        everything |= set(variables[name].split())
    everything |= {"wrk", "postgresql"}
    assert everything <= packages_installed_by("test")
    assert "make deps" in read(".ci/run")


# --- the README stands on its own --------------------------------------------

def readme_references(text):
    """Relative links and path-looking references of a Markdown text:
    `[..](target)` links, and `code spans` without spaces that start with
    `./` or `../`, or whose first part is an entry at the repository's top
    (`src/...`, `docs/DESIGN.md`, `run/...`), or that are a file name with
    an extension (`capi.c`)."""
    top = {p.name for p in REPO.iterdir()} | {"build", "run", "target"}
    refs = set()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
            refs.add(target.split("#")[0])
    for span in re.findall(r"`([^`\n]+)`", text):
        if " " in span or re.match(r"[a-z]+://", span):
            continue
        first = span.split("/")[0]
        if (span.startswith(("./", "../")) or ("/" in span and first in top)
                or re.fullmatch(r"[\w-]+\.(md|rs|py|t|sh|c|h|json|toml|conf|svg|png|yml|lua|go)", span)):
            refs.add(span)
    return refs


def git_ignores(path):
    """True when git ignores `path` (relative to the repository): a build
    output, a run's files, a token; it need not exist in a clone."""
    result = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO,
                            capture_output=True, timeout=30)
    return result.returncode == 0


def outside_or_missing(text, base):
    """References of `text` that leave the repository, or that name
    nothing in it (looked up from `base` and from the top, a bare file
    name anywhere) unless they are files git ignores (made by a build or
    a run)."""
    problems = []
    root = REPO.resolve()
    for ref in sorted(readme_references(text)):
        resolved = (base / ref).resolve()
        if root not in (resolved, *resolved.parents):
            problems.append(f"{ref}: outside the repository")
            continue
        candidates = [resolved, (REPO / ref).resolve()]
        if "/" not in ref.rstrip("/"):
            candidates += list(REPO.glob(f"**/{ref}"))
        if any(c.exists() for c in candidates):
            continue
        if git_ignores(str(resolved.relative_to(root))):
            continue
        problems.append(f"{ref}: no such file in the repository")
    return problems


def test_the_readme_references_nothing_outside_the_repository():
    """Its first paragraph pointed at ../shared/DESIGN.md, which a clone
    does not have."""
    assert outside_or_missing(read("README.md"), REPO) == []


@pytest.mark.parametrize("reference, problem", [
    ("the semantics are in [DESIGN](../shared/DESIGN.md).", "../shared/DESIGN.md: outside"),
    ("see `../shared/DESIGN.md`", "../shared/DESIGN.md: outside"),
    ("see `docs/NOPE.md`", "docs/NOPE.md: no such file"),
    ("see [the plan](docs/plan.md#top)", "docs/plan.md: no such file"),
])
def test_a_reference_outside_or_missing_is_caught(reference, problem):
    problems = outside_or_missing(read("README.md") + "\n" + reference + "\n", REPO)
    assert any(p.startswith(problem) for p in problems), problems
