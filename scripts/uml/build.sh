#!/usr/bin/env bash
# Builds the User-Mode Linux kernel gpuvm boots nouveau in, from Debian's linux-source-6.12.
#
#   scripts/uml/build.sh            # prints the path of the kernel binary on its last line
#
# Out of tree: the source is unpacked into $TARGET/uml/src and built into $TARGET/uml/build,
# where $TARGET is $CARGO_TARGET_DIR or the repository's target/. Idempotent: the kernel is
# not rebuilt unless config.fragment, a patch (virt-pci-reclaim.patch, uml-xstate-fallback.patch)
# or the package version changed
# (their hash is kept in $TARGET/uml/stamp). Also builds the guest test program
# (gpuvm-nvtest.c, static) into $TARGET/uml/rootfs/, the host directory UML mounts as its root.
# After a build only the kernel binary and the DRM UAPI headers ($TARGET/uml/uapi) are kept:
# the unpacked source and the object files are 2.9 GiB, and a changed stamp rebuilds from a
# fresh unpack anyway.
# Installs linux-source-6.12 and the build tools with apt-get when missing (needs root).
# Concurrent runs on one target directory (two test binaries, `gpuvm nouveau --build`) are
# serialized by an flock(1) on $TARGET/uml.lock: the second waits, then finds the kernel
# up to date.
set -euo pipefail

fail() {
    echo "uml build: FAILED: $*" >&2
    exit 1
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
out="$target/uml"
pkg=linux-source-6.12
tarball=/usr/src/linux-source-6.12.tar.xz

mkdir -p "$target"
command -v flock >/dev/null || fail "flock(1) (util-linux) is needed to serialize builders"
exec 9>"$target/uml.lock"
if ! flock -n 9; then
    echo "uml build: another build holds $target/uml.lock; waiting for it" >&2
    flock 9
fi

need_apt=()
dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need_apt+=("$pkg")
for tool in flex bison bc make gcc xz; do
    command -v "$tool" >/dev/null || need_apt+=("$tool")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
    pkgs=()
    for p in "${need_apt[@]}"; do
        case "$p" in xz) pkgs+=(xz-utils) ;; *) pkgs+=("$p") ;; esac
    done
    echo "uml build: installing ${pkgs[*]}" >&2
    command -v apt-get >/dev/null ||
        fail "missing ${pkgs[*]} and no apt-get to install them (a Debian/Ubuntu host is needed, or install them by hand)"
    [ "$(id -u)" = 0 ] || command -v sudo >/dev/null ||
        fail "missing ${pkgs[*]}: installing them with apt-get needs root"
    sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo -n)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq >&2 || echo "uml build: apt-get update failed; trying the install anyway" >&2
    "${sudo[@]}" apt-get install -y -qq "${pkgs[@]}" >&2 ||
        fail "apt-get install ${pkgs[*]} failed (is the Debian archive reachable? does it carry $pkg?)"
fi
[ -f "$tarball" ] || fail "$pkg is installed but $tarball is missing"

version="$(dpkg-query -W -f='${Version}' "$pkg")"
stamp="$( {
    echo "$version"
    echo "keeps: linux uapi"
    cat "$here/config.fragment" "$here/virt-pci-reclaim.patch" "$here/virt-pci-nested.patch" \
        "$here/uml-xstate-fallback.patch"
} | sha256sum | cut -d' ' -f1)"

# The guest test program: static, built against the kernel's DRM UAPI headers.
build_test_program() {
    mkdir -p "$out/rootfs"
    local src="$here/gpuvm-nvtest.c" bin="$out/rootfs/gpuvm-nvtest"
    if [ ! -x "$bin" ] || [ "$src" -nt "$bin" ]; then
        gcc -static -O2 -Wall -D__user= -idirafter "$out/uapi" -o "$bin.new" "$src" >&2
        mv "$bin.new" "$bin"
    fi
}

if [ -x "$out/linux" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "uml build: up to date ($pkg $version)" >&2
    build_test_program
    echo "$out/linux"
    exit 0
fi

echo "uml build: building $pkg $version into $out (takes minutes)" >&2
mkdir -p "$out"
rm -rf "$out/src" "$out/build" "$out/linux" "$out/uapi" "$out/stamp"
mkdir -p "$out/src" "$out/build"
tar -xf "$tarball" -C "$out/src" --strip-components=1
patch -d "$out/src" -p1 --forward < "$here/virt-pci-reclaim.patch" >&2
# Nested commands (an interrupt handler's accesses during a read) and teardown order.
patch -d "$out/src" -p1 --forward < "$here/virt-pci-nested.patch" >&2
# Userspace processes die at their first switch on hosts with a large XSAVE area (AMX).
patch -d "$out/src" -p1 --forward < "$here/uml-xstate-fallback.patch" >&2

jobs="$(nproc)"
make -s -C "$out/src" O="$out/build" ARCH=um defconfig >&2
cat "$here/config.fragment" >> "$out/build/.config"
make -s -C "$out/src" O="$out/build" ARCH=um olddefconfig >&2
# Every fragment line must have survived olddefconfig (a missing dependency drops it).
while IFS= read -r line; do
    case "$line" in ''|'#'*) continue ;; esac
    grep -qx -- "$line" "$out/build/.config" || {
        echo "uml build: '$line' did not survive olddefconfig" >&2
        exit 1
    }
done < "$here/config.fragment"
make -s -C "$out/src" O="$out/build" ARCH=um -j"$jobs" linux >&2
cp "$out/build/linux" "$out/linux.new"
mv "$out/linux.new" "$out/linux"
cp -r "$out/src/include/uapi" "$out/uapi"
rm -rf "$out/src" "$out/build"
echo "$stamp" > "$out/stamp"
build_test_program
echo "uml build: done" >&2
echo "$out/linux"
