# vkenv.sh — sourced by bench/gpu/run.sh and ab.sh: makes ekv reach the
# GPU on a machine without a Vulkan loader (the benchmark machine): unpacks
# Debian's libvulkan1 from $DEPS, links the libraries ekv lacks from $DEPS
# into $WORK/ekvlib, and picks the NVIDIA Vulkan driver (ICD) with which
# `ekv info --devices` shows a GPU. Needs: DEPS, WORK, EKV, DRY (1: keep the
# loader's default drivers, e.g. lavapipe). Sets EKV_LD, EKVCMD (ekv with
# that environment), VK_ICD_FILENAMES/VK_DRIVER_FILES; defines fill_missing
# FILE (links what FILE lacks) and gpu_seen.

# the Vulkan loader: Debian's libvulkan1, unpacked here (dpkg -x; Python if no dpkg)
VKLIB=""
deb=$(ls "$DEPS"/libvulkan1_*.deb 2>/dev/null | head -n 1)
if [ -n "$deb" ]; then
    mkdir -p "$WORK/vulkan"
    if command -v dpkg > /dev/null; then
        dpkg -x "$deb" "$WORK/vulkan"
    else
        python3 - "$deb" "$WORK/vulkan" << 'EOF'
import io, sys, tarfile
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'!<arch>\n', 'not a .deb'
off = 8
while off + 60 <= len(data):
    name = data[off:off + 16].decode().strip().rstrip('/')
    size = int(data[off + 48:off + 58])
    body = data[off + 60:off + 60 + size]
    off += 60 + size + (size & 1)
    if name.startswith('data.tar'):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(sys.argv[2])
EOF
    fi
    VKLIB=$(dirname "$(find "$WORK/vulkan" -name 'libvulkan.so.1' | head -n 1)")
    if [ -e "$VKLIB/libvulkan.so.1" ]; then
        echo "Vulkan loader: $(basename "$deb") unpacked to $VKLIB"
    else
        echo "WARNING: could not unpack $deb"
        VKLIB=""
    fi
else
    echo "WARNING: no $DEPS/libvulkan1_*.deb (run bench/gpu/deps.sh on a Debian machine); using the system's loader if any"
fi

# shared libraries from .deps: only those this machine lacks (ekv's own, and
# the X11/glvnd client libraries the NVIDIA Vulkan driver may need)
EKVLIB=$WORK/ekvlib
mkdir -p "$EKVLIB"
EKV_LD="${VKLIB:+$VKLIB:}$EKVLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fill_missing() { # fill_missing FILE: links into $EKVLIB the .deps libraries FILE lacks (transitively)
    local m new missing
    for _ in 1 2 3 4 5 6 7 8; do
        missing=$(LD_LIBRARY_PATH=$EKV_LD ldd "$1" 2>/dev/null | awk '/not found/ { print $1 }' | sort -u)
        [ -z "$missing" ] && return 0
        new=0
        for m in $missing; do
            if [ -f "$DEPS/$m" ] && [ ! -e "$EKVLIB/$m" ]; then ln -s "$DEPS/$m" "$EKVLIB/$m"; new=1; fi
        done
        [ "$new" = 0 ] && break
    done
    echo "WARNING: $(basename "$1") still lacks: $(echo "$missing" | tr '\n' ' ')"
}
if command -v ldd > /dev/null && [ "${EKV_GPU_BENCH_ALL_DEPS:-0}" != 1 ]; then
    fill_missing "$EKV"
else
    for f in "$DEPS"/*.so*; do [ -f "$f" ] && ln -sf "$f" "$EKVLIB/"; done
fi
EKVCMD=(env "LD_LIBRARY_PATH=$EKV_LD" "$EKV")

# the NVIDIA Vulkan driver (ICD): the first that makes ekv see a Vulkan GPU of
# the system's nvidia_icd.json files, one written for libGLX_nvidia.so.0, one
# written for libEGL_nvidia.so.0 (headless machines: GLX can fail without X)
find_lib() { # find_lib NAME: path of a library by ldconfig or the usual folders
    local p
    case $1 in */*) [ -e "$1" ] && echo "$1"; return ;; esac
    p=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | awk -v n="$1" '$1 == n && /x86-64/ { print $NF; exit }')
    [ -n "$p" ] && { echo "$p"; return; }
    for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
        [ -e "$d/$1" ] && { echo "$d/$1"; return; }
    done
}
gpu_seen() { timeout 60 "${EKVCMD[@]}" info --devices 2>/dev/null | grep -v '(cpu)' | grep -q '^vulkan'; }
try_icd() { # try_icd JSON: use it, bring what its library lacks, then does ekv see a GPU?
    local lib
    export VK_ICD_FILENAMES=$1 VK_DRIVER_FILES=$1
    lib=$(sed -n 's/.*"library_path"[^"]*"\([^"]*\)".*/\1/p' "$1" | head -n 1)
    lib=$(find_lib "$lib")
    echo "Vulkan driver $1: $(tr -s ' \n' ' ' < "$1" | cut -c1-200)"
    if [ -n "$lib" ]; then command -v ldd > /dev/null && fill_missing "$lib"; else echo "  (its library is not found)"; fi
    gpu_seen
}
ICD_OK=""
if [ "$DRY" = 1 ]; then
    echo "dry run: the loader's default drivers (lavapipe is vulkan:0)"
else
    icds=()
    [ -n "${EKV_GPU_BENCH_ICD:-}" ] && icds+=("$EKV_GPU_BENCH_ICD")      # tried first
    for f in /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json \
        /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/local/share/vulkan/icd.d/nvidia_icd.json \
        /usr/share/vulkan/icd.d/nvidia_icd.x86_64.json /etc/vulkan/icd.d/nvidia_icd.x86_64.json; do
        [ -f "$f" ] && icds+=("$f")
    done
    for n in GLX EGL; do
        l=$(find_lib "lib${n}_nvidia.so.0")
        [ -n "$l" ] || continue
        printf '{ "file_format_version": "1.0.0", "ICD": { "library_path": "%s", "api_version": "1.3.0" } }\n' "$l" \
            > "$WORK/nvidia_icd_$n.json"
        icds+=("$WORK/nvidia_icd_$n.json")
    done
    for f in "${icds[@]}"; do
        if try_icd "$f"; then ICD_OK=$f; break; fi
        echo "  -> no Vulkan GPU with it"
    done
    if [ -n "$ICD_OK" ]; then
        export VK_ICD_FILENAMES=$ICD_OK VK_DRIVER_FILES=$ICD_OK
        echo "using VK_ICD_FILENAMES=$ICD_OK"
    elif [ "${#icds[@]}" -gt 0 ]; then
        export VK_ICD_FILENAMES=${icds[0]} VK_DRIVER_FILES=${icds[0]}
        echo "WARNING: no NVIDIA Vulkan driver worked; keeping ${icds[0]} (its errors follow under ## machine)"
    else
        unset VK_ICD_FILENAMES VK_DRIVER_FILES
        echo "WARNING: no NVIDIA Vulkan driver (nvidia_icd.json, libGLX_nvidia.so.0, libEGL_nvidia.so.0): the container may lack the 'graphics' driver capability"
    fi
fi
echo "libraries taken from .deps: $(cd "$EKVLIB" && ls | tr '\n' ' ')"
echo "NVIDIA user-space libraries: $( (ls /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/local/nvidia/lib 2>/dev/null) \
    | grep -E '^lib(GLX_nvidia|EGL_nvidia|GLdispatch|nvidia-glcore|nvidia-glvkspirv|nvidia-gpucomp|cuda)\.so' | sort -u | tr '\n' ' ')"
