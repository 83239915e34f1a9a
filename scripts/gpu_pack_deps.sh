#!/usr/bin/env bash
# scripts/gpu_pack_deps.sh: run HERE (a Debian 12 machine with apt) before a device run.
# Packs the engine's small libraries (cJSON, PCRE2, utf8proc, xxhash, cmocka) and pkgconf into
# .gpu-deps/sysroot.tar.gz (headers, shared libraries, .pc files only; under 1 MB) for the
# GPU machine, which has the CUDA toolkit and CMake but no package registry.  BLAS/LAPACK are
# NOT carried (OpenBLAS alone is ~7 MB and the working tree that travels is capped at 64 MiB):
# scripts/gpu_check.sh builds scripts/gpu_shim/ (naive CBLAS/LAPACKE subset) instead.
# .gpu-deps/ goes into .git/info/exclude; name it in the device tool's `carry`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.gpu-deps"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest" "$work/debs" "$work/sysroot"
grep -qx '/.gpu-deps/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu-deps/' >> "$root/.git/info/exclude"
pkgs=(libcjson1 libcjson-dev libpcre2-8-0 libpcre2-dev libutf8proc2 libutf8proc-dev
      libxxhash0 libxxhash-dev libcmocka0 libcmocka-dev pkgconf-bin libpkgconf3)
(cd "$work/debs" && apt-get download "${pkgs[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
for d in "$work"/debs/*.deb; do dpkg-deb -x "$d" "$work/sysroot"; done
s="$work/sysroot"
# keep headers, shared objects, .pc files and the pkgconf binary; drop docs, static archives,
# the 16/32-bit and POSIX PCRE2 variants and the pcre2 tools
rm -rf "$s/usr/share/doc" "$s/usr/share/man" "$s/usr/share/lintian" "$s/usr/bin/pcre2"* "$s/usr/share/aclocal"
find "$s" -name '*.a' -delete
find "$s" \( -name 'libpcre2-16*' -o -name 'libpcre2-32*' -o -name 'libpcre2-posix*' -o -name 'libpcre2-16.pc' \
        -o -name 'libpcre2-32.pc' -o -name 'libpcre2-posix.pc' \) -exec rm -f {} +
# dangling links (to the variants removed above) would break tar -x on the other side
find "$s" -xtype l -delete
rm -f "$dest/sysroot.tar.xz"
tar -C "$s" -czf "$dest/sysroot.tar.gz" .   # gzip: present on every image
ls -la "$dest"
