"""tests/router/tlscerts.py: a throw-away PKI for the TLS tests and the TLS bench, made with the
`openssl` command line: a fleet CA, certificates it signs (router, nodes, a client), and a second
"rogue" CA with a node certificate of its own, which the fleet must refuse.

Every leaf certificate names 127.0.0.1 and localhost (subjectAltName), carries serverAuth and
clientAuth (a fleet member is a server and, towards other members, a client) and lives two days.

    pki = tlscerts.make(dir)      # {"ca": path, "router": (cert, key), "node-a": ..., ...}
"""
import os
import subprocess

LEAVES = ("router", "node-a", "node-b", "node-c", "client")


def _run(args, cwd):
    r = subprocess.run(["openssl"] + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError("openssl %s failed: %s" % (" ".join(args), r.stderr.strip()))


def _ca(d, name, subject):
    _run(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
          "-keyout", name + "-key.pem", "-out", name + ".pem", "-days", "2", "-subj", subject,
          "-addext", "basicConstraints=critical,CA:TRUE",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign"], d)
    return os.path.join(d, name + ".pem")


def _leaf(d, ca, name, cn, serial):
    ext = os.path.join(d, name + ".ext")
    with open(ext, "w") as f:
        f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _run(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
          "-keyout", name + "-key.pem", "-out", name + ".csr", "-subj", "/CN=" + cn], d)
    _run(["x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + "-key.pem",
          "-set_serial", str(serial), "-days", "2", "-out", name + ".pem", "-extfile", ext], d)
    return os.path.join(d, name + ".pem"), os.path.join(d, name + "-key.pem")


def make(d):
    """Create the PKI in directory d (idempotent: an existing one is reused)."""
    os.makedirs(d, exist_ok=True)
    done = os.path.join(d, "done")
    out = {"ca": os.path.join(d, "ca.pem"), "rogue-ca": os.path.join(d, "rogue-ca.pem")}
    for n in LEAVES:
        out[n] = (os.path.join(d, n + ".pem"), os.path.join(d, n + "-key.pem"))
    out["rogue-node"] = (os.path.join(d, "rogue-node.pem"), os.path.join(d, "rogue-node-key.pem"))
    if os.path.exists(done):
        return out
    _ca(d, "ca", "/CN=kvlingo test fleet CA")
    _ca(d, "rogue-ca", "/CN=rogue CA")
    for i, n in enumerate(LEAVES):
        _leaf(d, "ca", n, "kvlingo-" + n, 100 + i)
    _leaf(d, "rogue-ca", "rogue-node", "kvlingo-node-a", 900)   # the same name, the wrong CA
    open(done, "w").close()
    return out


def read(path):
    with open(path, "rb") as f:
        return f.read()
