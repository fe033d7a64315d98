"""DVC stage entry points (`python -m stages.<name>`): each reads params, calls the library, writes outputs."""

from selfcest.determinism import pin_cpu_kernels

# Before any stage imports torch: the same seed gives the same weights on AVX2 and AVX-512 CPUs.
pin_cpu_kernels()
