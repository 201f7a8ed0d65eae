// Definitions every kernel source may use; the sources compile as one
// translation unit in name order (tools/cuda/build_fatbin.sh), so this file
// comes first.
#include <stdint.h>

// Programmatic dependent launch (sm_90): kernels/cuda launches the kernels
// it names in pdlKernels (pdl.go) with the programmatic stream
// serialization attribute, so that a kernel's blocks may be scheduled
// while the kernel before it drains. Every such kernel starts with
// FERRITE_PDL_WAIT(): griddepcontrol.wait holds the block until the grids
// it depends on have completed and their writes are visible (so nothing is
// read or written early), and launch_dependents then lets the next kernel
// be scheduled in turn. Without the attribute (older GPUs, PDL off) the
// wait returns at once; on sm_80 the macro is empty.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FERRITE_PDL_WAIT()                                  \
    do {                                                    \
        asm volatile("griddepcontrol.wait;" ::: "memory");  \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
    } while (0)
#else
#define FERRITE_PDL_WAIT() \
    do {                   \
    } while (0)
#endif
