#!/usr/bin/env python3
"""tests/deploy/emulate_image.py WORK_DIR [--keep]

Builds and runs deploy/Dockerfile's CPU image WITHOUT a Docker engine, for machines that have
none (ours): each stage's root filesystem is a Debian 12 `debootstrap --variant=minbase` tree (what
debian:12 and debian:12-slim hold), and the Dockerfile's own instructions -- ARG, WORKDIR, COPY,
COPY --from=build, RUN, USER -- are carried out in order, RUN lines in a chroot.  Then, as the
image's USER, it does what a pod of deploy/k8s does: the StatefulSet's seed-model init script
fills a /models volume from the image, two kvld and a router start, the image's HEALTHCHECK
command passes for each, and `kvlingo chat` runs three turns that must switch qwen3-a -> qwen3-b
-> qwen3-a by translation (with the shipped translators the image serves); SIGTERM must end
every process with status 0.

Manual, not part of CTest: it needs root (chroot, mount), debootstrap (Debian package) and
Debian's package mirror, and builds the whole project (several minutes on two cores).
WORK_DIR keeps the two trees; a second run reuses them (remove WORK_DIR to start afresh).
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from check_dockerfile import instructions  # noqa: E402

import yaml  # noqa: E402

ENV0 = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}


def sh(cmd, **kw):
    print("+ " + (cmd if isinstance(cmd, str) else " ".join(cmd)), flush=True)
    return subprocess.run(cmd, shell=isinstance(cmd, str), **kw)


def rootfs(path):
    if not os.path.exists(os.path.join(path, "etc", "debian_version")):
        r = sh(["debootstrap", "--variant=minbase", "bookworm", path, "http://deb.debian.org/debian"],
               stdout=subprocess.DEVNULL)
        if r.returncode:
            sys.exit(f"debootstrap {path} failed")
    shutil.copy("/etc/resolv.conf", os.path.join(path, "etc", "resolv.conf"))


def mount(path):
    sh(["mount", "-t", "proc", "proc", f"{path}/proc"], check=True)
    for d in ("dev", "sys"):
        sh(["mount", "--bind", f"/{d}", f"{path}/{d}"], check=True)


def umount(path):
    for d in ("sys", "dev", "proc"):
        subprocess.run(["umount", f"{path}/{d}"], stderr=subprocess.DEVNULL)


def copy(src, dst):
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)


def run_stage(ins, name, root, roots, args):
    """Carry out the instructions of stage `name` (and of the stages it is FROM) in `root`."""
    stages, cur = {}, None
    for k, a, n in ins:
        if k == "FROM":
            words = a.split()
            cur = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else None
            base = words[0]
            stages[cur] = {"base": base, "ins": []}
        elif cur:
            stages[cur]["ins"].append((k, a, n))
    env, workdir, user = dict(ENV0), "/", "0"

    def expand(s):
        return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), s)

    chain, st = [], name
    while st in stages:
        chain.insert(0, st)
        st = expand(stages[st]["base"])
    for st in chain:
        for k, a, n in stages[st]["ins"]:
            if k == "ARG":
                key, _, val = a.partition("=")
                args.setdefault(key, val)
                env[key] = args[key]
            elif k == "ENV":
                for kv in shlex.split(a):
                    key, _, val = kv.partition("=")
                    env[key] = expand(val)
            elif k == "WORKDIR":
                workdir = a
                os.makedirs(root + a, exist_ok=True)
            elif k == "USER":
                user = a
            elif k in ("COPY", "ADD"):
                words = shlex.split(a)
                frm = [w.split("=", 1)[1] for w in words if w.startswith("--from=")]
                words = [w for w in words if not w.startswith("--")]
                srcs, dst = words[:-1], words[-1]
                dst = dst if dst.startswith("/") else os.path.join(workdir, dst)
                for s in srcs:
                    if re.match(r"https?://|\$", s):
                        sys.exit(f"Dockerfile:{n}: {k} of a URL (the CUDA variant) is not emulated")
                    origin = (roots[frm[0]] + s) if frm else os.path.join(SRC, s)
                    target = root + dst
                    if dst.endswith("/") and not os.path.isdir(origin):
                        target = os.path.join(target, os.path.basename(origin))
                    copy(origin.rstrip("/") if os.path.isdir(origin) else origin, target)
                print(f"{k} {a}", flush=True)
            elif k == "RUN":
                print(f"RUN (Dockerfile:{n}) {a[:110]}", flush=True)
                cmd = ["chroot", root, "/usr/bin/env", "-i"] + \
                      [f"{x}={y}" for x, y in env.items()] + ["/bin/sh", "-c", f"cd {workdir} && {a}"]
                if subprocess.run(cmd).returncode:
                    sys.exit(f"FAIL: RUN at Dockerfile:{n}")
            elif k == "HEALTHCHECK":
                env["__HEALTHCHECK__"] = a
    return env, user


def smoke(root, env, user, ins):
    """The image's USER runs what deploy/k8s runs, on loopback ports."""
    hc = next(a for k, a, _ in ins if k == "HEALTHCHECK")
    hc = json.loads(hc[hc.index("CMD") + 3:].strip())
    sts = next(d for d in yaml.safe_load_all(open(os.path.join(SRC, "deploy/k8s/base/kvld-qwen3-a.yaml")))
               if d["kind"] == "StatefulSet")
    seed = sts["spec"]["template"]["spec"]["initContainers"][0]["args"][0]
    uid = user.split(":")[0]
    for d in ("models", "var/lib/kvlingo"):
        subprocess.run(["chroot", root, "sh", "-c", f"rm -rf /{d}/* && chown -R {user} /{d}"])

    def as_user(cmd, extra_env=None, **kw):
        e = {k: v for k, v in env.items() if not k.startswith("__")}
        e.update(extra_env or {})
        return subprocess.run(["chroot", f"--userspec={user}", root, "/usr/bin/env", "-i"] +
                              [f"{x}={y}" for x, y in e.items()] + cmd, **kw)

    for m in ("qwen3-a", "qwen3-b"):
        if as_user(["/bin/sh", "-c", seed], {"KVL_MODEL": m}).returncode:
            sys.exit(f"FAIL: the seed-model init script for {m}")
    fleet = {"listen": "127.0.0.1:17000", "metrics": "127.0.0.1:17001",
             "ledger": "/var/lib/kvlingo/router.db", "tokenizer": "/opt/kvlingo/models/qwen3-a",
             "nodes": [{"name": "qwen3-a-0", "address": "127.0.0.1:17100", "model": "qwen3-a"},
                       {"name": "qwen3-b-0", "address": "127.0.0.1:17200", "model": "qwen3-b"}],
             "policy": {"name": "cascade", "models": ["qwen3-a", "qwen3-b"]},
             "insecure": True}   # loopback inside the emulated container: plaintext, by name
    yaml.safe_dump(fleet, open(root + "/tmp/fleet.yaml", "w"))
    procs, ok = [], True
    try:
        for m, p in (("qwen3-a", 17100), ("qwen3-b", 17200)):
            procs.append(subprocess.Popen(
                ["chroot", f"--userspec={user}", root, "/usr/bin/env", f"PATH={env['PATH']}",
                 "UCX_TLS=tcp,self", "kvld", "--model", f"/models/{m}", "--listen", f"127.0.0.1:{p}",
                 "--metrics", f"127.0.0.1:{p + 1}", "--translators", "/models/translators",
                 "--threads", "1", "--insecure"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(3)
        procs.append(subprocess.Popen(
            ["chroot", f"--userspec={user}", root, "/usr/bin/env", f"PATH={env['PATH']}",
             "kvlingo-router", "--config", "/tmp/fleet.yaml"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(3)
        for port in ("17101", "17201", "17001"):
            r = as_user(hc, {"KVL_HEALTH_PORT": port})
            print(f"HEALTHCHECK on {port}: {'ok' if r.returncode == 0 else 'FAILED'}")
            ok &= r.returncode == 0
        sid = ""
        for i, m in enumerate(("qwen3-a", "qwen3-b", "qwen3-a")):
            cmd = ["kvlingo", "chat", "--router", "127.0.0.1:17000", "--insecure", "--model", m,
                   "--max-tokens", "8"] + (["--session", sid] if sid else []) + \
                  [f"Turn {i}: she opened the door slowly, and the light from the hall fell in."]
            out = as_user(cmd, capture_output=True, text=True).stdout.strip().splitlines()
            line = out[-1] if out else ""
            print(line)
            sid = sid or (re.findall(r"session (s-[0-9a-f]+)", line) or [""])[0]
            if i and "switch translate" not in line:
                print(f"FAIL: turn {i} was not a translated switch")
                ok = False
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                rc = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = "killed"
            if rc != 0:
                print(f"FAIL: {' '.join(p.args[5:7])} ended with {rc} after SIGTERM")
                ok = False
    return ok


def main():
    if len(sys.argv) < 2 or os.geteuid() != 0 or not shutil.which("debootstrap"):
        print(__doc__)
        return 2
    work = os.path.abspath(sys.argv[1])
    ins = instructions(open(os.path.join(SRC, "deploy", "Dockerfile")).read())
    roots = {"build": os.path.join(work, "build"), "runtime": os.path.join(work, "runtime")}
    for r in roots.values():
        rootfs(r)
    for r in roots.values():
        mount(r)
    try:
        args = {"CUDA": "0"}
        run_stage(ins, "build", roots["build"], roots, dict(args))
        env, user = run_stage(ins, "runtime", roots["runtime"], roots, dict(args))
        ok = smoke(roots["runtime"], env, user, ins)
    finally:
        for r in roots.values():
            umount(r)
    print("PASS: the image builds and runs (emulated)" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
