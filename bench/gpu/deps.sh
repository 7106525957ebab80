#!/bin/sh
# deps.sh — recreates bench/gpu/.deps/ (git-ignored), the run-time files that
# bench/gpu/run.sh carries to a GPU machine that has no network and no Vulkan
# loader: the Debian libvulkan1 package (run.sh unpacks it with dpkg -x) and
# the shared libraries of the ekv binary that are not part of glibc
# (libmicrohttpd, libcjson, libgnutls and their dependencies), copied under
# their soname, and the client libraries the NVIDIA Vulkan driver
# (libGLX_nvidia.so.0) links: libGLdispatch (glvnd), libX11, libXext and theirs.
# run.sh only uses a copied library when the GPU machine lacks it.
#
# Run on a Debian/Ubuntu machine with the ekv binary built (needs apt-get
# download, ldd, dpkg -S; no root needed beyond what apt-get download needs):
#   sh bench/gpu/deps.sh                # uses build/ekv
#   EKV=path/to/ekv sh bench/gpu/deps.sh
# It was run on Debian 12 (bookworm), the CPU machines' OS; about 7 MiB result.
#
#   sh bench/gpu/deps.sh --llama        # also: bench/gpu/.llama/{a,b}/ (git-ignored)
# splits $SHARED/tools/gpu/llama-bench-cuda-sm90.xz (41 MB) into two pieces
# (EKV_LLAMA_PIECES=3: three, a b c), for a device tool that carries at most
# 64 MiB a call with the working tree (34 MiB of it tracked files): carry
# .llama/a in one call and .llama/b in the next (ignored files stay on a
# warm machine between calls); run.sh joins the pieces it finds.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
EKV=${EKV:-$repo/build/ekv}
deps=$here/.deps

if [ "${1:-}" = --llama ]; then
    SHARED=${SHARED:-$repo/../shared}
    xzf=$SHARED/tools/gpu/llama-bench-cuda-sm90.xz
    [ -f "$xzf" ] || { echo "deps.sh: no $xzf (set SHARED)" >&2; exit 1; }
    rm -rf "$here/.llama"
    n=${EKV_LLAMA_PIECES:-2}
    size=$(wc -c < "$xzf")
    split -b $(( (size + n - 1) / n )) -a 2 "$xzf" "$here/.llama/llama-bench-cuda-sm90.xz.part-" 2> /dev/null ||
        { mkdir -p "$here/.llama" && split -b $(( (size + n - 1) / n )) -a 2 "$xzf" "$here/.llama/llama-bench-cuda-sm90.xz.part-"; }
    i=0
    for part in "$here"/.llama/llama-bench-cuda-sm90.xz.part-*; do     # piece k in folder a, b, c, ...
        d=$(printf "\\$(printf '%03o' $((97 + i)))")
        mkdir -p "$here/.llama/$d" && mv "$part" "$here/.llama/$d/"
        i=$((i + 1))
    done
    du -ab "$here/.llama"
    exit 0
fi
[ -x "$EKV" ] || { echo "deps.sh: no ekv binary at $EKV (build it, or set EKV)" >&2; exit 1; }
rm -rf "$deps"
mkdir -p "$deps"

# 1. the Vulkan loader package (ekv dlopens libvulkan.so.1 at run time)
(cd "$deps" && { apt-get download libvulkan1 || { apt-get update && apt-get download libvulkan1; }; })

# 2. non-glibc shared libraries the binary links (the whole ldd closure)
ldd "$EKV" | awk '/=> \// { print $1, $3 }' | while read -r soname path; do
    pkg=$(dpkg -S "$path" 2>/dev/null || dpkg -S "$(readlink -f "$path")" 2>/dev/null || true)
    pkg=${pkg%%:*}
    case "$pkg" in
        libc6|libc6-*) continue ;;               # glibc itself: the target has its own
    esac
    case "$soname" in                             # glibc by name when dpkg -S knew nothing
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libmvec.so.*|ld-linux*) continue ;;
    esac
    cp -L "$path" "$deps/$soname"
    echo "copied $soname (${pkg:-unknown package})"
done

# 3. the client libraries the NVIDIA Vulkan driver links (libGLX_nvidia.so.0 needs
#    libGLdispatch, libX11 and libXext; a bare CUDA container may lack them)
tmp=$(mktemp -d)
(cd "$tmp" && apt-get download libglvnd0 libx11-6 libxext6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0)
for deb in "$tmp"/*.deb; do
    dpkg -x "$deb" "$tmp/x"
done
for link in "$tmp"/x/usr/lib/x86_64-linux-gnu/lib*.so.[0-9]*; do
    name=$(basename "$link")
    case $name in libGLdispatch.so.0|lib*.so.[0-9]) ;; *) continue ;; esac   # sonames only
    [ -L "$link" ] || [ "$name" = libGLdispatch.so.0 ] || continue
    cp -L "$link" "$deps/$name"
    echo "copied $name (for the NVIDIA Vulkan driver)"
done
rm -rf "$tmp"

# 4. record what was collected
{
    echo "collected $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME") for $EKV"
    (cd "$deps" && ls -l)
} > "$deps/MANIFEST.txt"
du -sh "$deps"
