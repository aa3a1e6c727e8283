# Makefile: builds train_gpt (CPU backend always; the CUDA backend too when
# nvcc is found), the embedded dataset, and the test programs.
#   make              the trainer and the embedded dataset
#   make tests        the test programs (tests/*/*.cpp -> build/NAME)
#   make test         the whole test suite (tests/run_tests.sh, every tier)
#   make NO_CUDA=1    build without the CUDA backend even if nvcc exists
#   make -C dev/cuda  the CUDA kernel lab
# mpicxx when OpenMPI is installed (data parallel and the later modes);
# without it the trainer builds as a single-process program.
MPICXX   ?= $(shell command -v mpicxx 2>/dev/null)
ifneq ($(MPICXX),)
CXX      := $(MPICXX)
MPI_DEF  := -DLLMC_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX
endif
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
# OpenBLAS built on OpenMP shares the trainer's thread pool; the pthread
# build spins its own threads against OpenMP's and runs 1.5-2x slower here.
ARCH     := $(shell uname -m)-linux-gnu
comma    := ,
BLAS_DIR ?= $(firstword $(wildcard /usr/lib/$(ARCH)/openblas-openmp /usr/lib/$(ARCH)/openblas-pthread))
BLAS_INC ?= $(firstword $(wildcard /usr/include/$(ARCH)/openblas-openmp /usr/include/$(ARCH)/openblas-pthread /usr/include/openblas))
# The CPU ops' loops are written for the compiler's vectoriser: -march=native
# lets it use this machine's widest SIMD (AVX2, AVX-512). A binary built for
# another machine (scripts/gpu/bundle.sh) sets CPU_ARCH to a baseline the
# other machine surely has.
CPU_ARCH ?= -march=native
CXXFLAGS ?= -O3
CXXFLAGS += $(CPU_ARCH) -std=c++17 -Wall -Wextra -fopenmp -I. $(if $(BLAS_INC),-I$(BLAS_INC)) $(MPI_DEF)
BLAS_RPATH := -Wl,-rpath,$(BLAS_DIR)
ifneq ($(BLAS_INC),)
LDLIBS   += $(if $(BLAS_DIR),-L$(BLAS_DIR) $(BLAS_RPATH)) -lopenblas -lm
else
# No OpenBLAS (a GPU machine's image, say): the CPU backend uses plain loops.
CXXFLAGS += -DLLMC_NO_BLAS
LDLIBS   += -lm
$(info building without OpenBLAS (plain-loop matrix products on the CPU))
endif
BUILD    := build

# The library: every llmc/LAYER/*.cpp, one object each under build/llmc/.
LIB_SRCS := $(wildcard llmc/*/*.cpp)
LIB_OBJS := $(patsubst %.cpp,$(BUILD)/%.o,$(LIB_SRCS))

ifeq ($(NO_CUDA),)
ifneq ($(NVCC),)
ifneq ($(wildcard llmc/backend/backend_cuda.cu),)
USE_CUDA := 1
endif
endif
endif

ifdef USE_CUDA
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# The CUDA libraries (cudart, cuBLAS, cuBLASLt): $(CUDA_HOME)/lib64 in a
# toolkit install, else $(CUDA_HOME)/lib (pip-installed toolkits) or the
# toolkit's targets/ARCH/lib, else wherever the dynamic linker's cache
# (ldconfig -p) has libcudart; none found: left to the linker's defaults.
CUDA_LIBDIR ?= $(or $(firstword $(foreach d,lib64 lib targets/$(shell uname -m)-linux/lib,$(if $(wildcard \
               $(CUDA_HOME)/$(d)/libcudart.so*),$(CUDA_HOME)/$(d)))),$(patsubst %/,%,$(dir $(shell PATH="$$PATH:/sbin:/usr/sbin" \
               ldconfig -p 2>/dev/null | awk '/libcudart[.]so/{print $$NF; exit}'))))
CUDA_ARCH  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a
NVCCFLAGS  ?= -O3
NVCCFLAGS  += -std=c++17 $(CUDA_ARCH) -I. -Xcompiler -Wall $(MPI_DEF)
# The host code learns that the binary holds sm_90a code (the Hopper attention).
NVCCFLAGS  += $(if $(findstring compute_90a,$(CUDA_ARCH)),-DLLMC_SM90A)
CXXFLAGS   += -DLLMC_CUDA
CUDA_OBJS  := $(BUILD)/llmc/backend/backend_cuda.o $(BUILD)/llmc/backend/cuda_device.o
LDLIBS     += $(if $(CUDA_LIBDIR),-L$(CUDA_LIBDIR) -Wl$(comma)-rpath$(comma)$(CUDA_LIBDIR)) -lcublasLt -lcublas -lcudart
ifneq ($(MPICXX),)
# NCCL and the host-staged MPI communicator for device buffers.
# (Open MPI 5's wrapper adds -pthread, which nvcc passes on only via -Xcompiler.)
NVCCFLAGS  += $(patsubst -pthread,-Xcompiler=-pthread,$(shell $(MPICXX) --showme:compile))
CUDA_OBJS  += $(BUILD)/llmc/comm/comm_nccl.o $(BUILD)/llmc/comm/comm_staged.o
LDLIBS     += -lnccl
endif
$(info building with the CUDA backend ($(NVCC); libraries: $(or $(CUDA_LIBDIR),the linker's default paths)))
else
$(info building without the CUDA backend (no nvcc, or NO_CUDA set))
endif

DATA := data/tiny/tiny_train_000001.bin data/tiny/tiny_val_000000.bin data/tiny/tokenizer.bin

.PHONY: all tests test clean
all: train_gpt $(DATA)

# The object files depend on every header: simple and always right.
HEADERS := $(wildcard llmc/*/*.h llmc/backend/cuda/*.cuh llmc/backend/cuda/*.h) Makefile
# Remember whether the last build had CUDA, so switching rebuilds.
$(BUILD)/.flags: FORCE
	@mkdir -p $(BUILD)
	@echo '$(CXXFLAGS) $(USE_CUDA)' | cmp -s - $@ || echo '$(CXXFLAGS) $(USE_CUDA)' > $@
FORCE:

$(BUILD)/llmc/%.o: llmc/%.cpp $(HEADERS) $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/llmc/%.o: llmc/%.cu $(HEADERS) $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

train_gpt: train_gpt.cu $(LIB_OBJS) $(CUDA_OBJS)
	$(CXX) $(CXXFLAGS) -x c++ $< -x none $(LIB_OBJS) $(CUDA_OBJS) -o $@ $(LDLIBS)

# The embedded dataset, made by the project's own generator.
$(BUILD)/make_tiny: data/make_tiny.cpp $(BUILD)/llmc/io/tokenizer.o $(BUILD)/llmc/io/bpe.o $(BUILD)/llmc/io/pretokenize.o \
                   $(BUILD)/llmc/io/unicode_table.o $(BUILD)/llmc/base/fileio.o
	$(CXX) $(CXXFLAGS) $^ -o $@

$(DATA) &: $(BUILD)/make_tiny
	$(BUILD)/make_tiny data/tiny

# Test programs: tests/TIER/NAME.cpp, each linked with the library into
# build/NAME (tests/run_tests.sh says what each tier needs); code they share
# lives in headers, tests/TIER/*.h.
TEST_SRCS  := $(wildcard tests/*/*.cpp)
TEST_PROGS := $(addprefix $(BUILD)/,$(basename $(notdir $(TEST_SRCS))))
TEST_DEPS  := $(wildcard tests/*/*.h) $(LIB_OBJS) $(CUDA_OBJS)
define test_program
$(BUILD)/$(basename $(notdir $(1))): $(1) $(TEST_DEPS)
	$$(CXX) $$(CXXFLAGS) $$< $$(LIB_OBJS) $$(CUDA_OBJS) -o $$@ $$(LDLIBS)
endef
$(foreach src,$(TEST_SRCS),$(eval $(call test_program,$(src))))

tests: $(TEST_PROGS)

test: all tests
	bash tests/run_tests.sh

clean:
	rm -rf $(BUILD) train_gpt
