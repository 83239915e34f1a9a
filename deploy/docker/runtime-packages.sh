#!/usr/bin/env bash
# deploy/docker/runtime-packages.sh BUILD_DIR OUT_DIR
#
# Used by deploy/Dockerfile's build stage.  Finds the three kvlingo programs in BUILD_DIR (kvld,
# kvlingo-router, kvlingo), copies them to OUT_DIR/bin, and writes OUT_DIR/runtime-packages.txt:
# the Debian packages that own the shared libraries they link (ldd + dpkg -S), one per line,
# without the -dev packages (a runtime image needs libgrpc29, not libgrpc-dev).  The runtime
# stage installs exactly that list, so no second hand-kept package list can drift from what the
# build links.  Libraries ldd cannot find (the GPU driver's libcuda.so, which the NVIDIA
# container toolkit brings at run time) are reported and left out.
set -euo pipefail
build=${1:?usage: runtime-packages.sh BUILD_DIR OUT_DIR}
out=${2:?usage: runtime-packages.sh BUILD_DIR OUT_DIR}
mkdir -p "$out/bin"

bins=()
for name in kvld kvlingo-router kvlingo; do
  path=$(find "$build" -type f -perm -u+x -name "$name" -not -path '*/CMakeFiles/*' | sort | head -n1)
  if [ -z "$path" ]; then
    echo "runtime-packages: $name not found under $build (was it built?)" >&2
    exit 1
  fi
  install -m 0755 "$path" "$out/bin/$name"
  bins+=("$out/bin/$name")
done

# shared libraries of the three programs, each once
declare -A libs=()
for bin in "${bins[@]}"; do
  while read -r lib arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      echo "runtime-packages: $(basename "$bin"): $lib not found at build time (left to the host)" >&2
      continue
    fi
    libs["$path"]=1
  done < <(ldd "$bin")
done

# owners, in one dpkg query: dpkg records some files under /lib, others under /usr/lib (merged
# /usr), so every library is asked under each of its names
declare -A owner_of=()
cands=()
for path in "${!libs[@]}"; do
  real=$(readlink -f "$path")
  cands+=("$real" "$path" "${real#/usr}" "/usr$real")
done
while IFS= read -r line; do
  owner_of["${line#*: }"]=${line%%: *}
done < <(dpkg -S "${cands[@]}" 2>/dev/null)

pkgs=()
for path in "${!libs[@]}"; do
  real=$(readlink -f "$path")
  owner=""
  for cand in "$real" "$path" "${real#/usr}" "/usr$real"; do
    owner=${owner_of["$cand"]:-}
    [ -n "$owner" ] && break
  done
  owner=${owner%%,*}; owner=${owner%%:*}   # "libfoo:amd64, libbar" -> "libfoo"
  if [ -z "$owner" ]; then
    case "$real" in
      /usr/local/cuda*)
        # a CUDA toolkit installed without dpkg (NVIDIA's runfile): its runtime libraries come
        # with the CUDA variant's runtime layer (NVIDIA's apt packages), not from this list
        echo "runtime-packages: $real is the CUDA toolkit's, not a Debian package's (left to the CUDA layer)" >&2
        continue ;;
    esac
    echo "runtime-packages: no Debian package owns $real" >&2
    exit 1
  fi
  case "$owner" in
    *-dev) echo "runtime-packages: $real belongs to $owner (a -dev package)" >&2; exit 1 ;;
  esac
  pkgs+=("$owner")
done
printf '%s\n' "${pkgs[@]}" | sort -u > "$out/runtime-packages.txt"
echo "runtime-packages: $(wc -l < "$out/runtime-packages.txt") packages: $(tr '\n' ' ' < "$out/runtime-packages.txt")"
