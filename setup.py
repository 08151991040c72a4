"""Build script: the optional C++/CUDA extension ``specdec_kernels._C``.

The extension is built only where it can be: the C++ CPU kernels wherever a C++ compiler and
torch's headers are present, the CUDA kernels only when a CUDA toolkit *and* a CUDA build of
torch are present. Nothing is probed over the network and a failed or skipped build never fails
the install: the package then uses its pure-PyTorch fallback (with a one-time warning).

Environment variables
---------------------
SPECDEC_NO_EXTENSION=1   build no extension at all (pure Python install).
SPECDEC_NO_CUDA=1        build the CPU extension only, even where CUDA is available.
SPECDEC_SANITIZE=1       build the CPU extension with AddressSanitizer and UBSan (-O1 -g; signed
                         overflow is reported although Python's own flags say -fwrapv); implies
                         SPECDEC_NO_CUDA. Used by scripts/sanitize.sh, which builds it in a copy of
                         the tree and loads it with the sanitizer runtimes preloaded.
"""

import glob
import os
import sys
import warnings

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _env_flag(name):
    return os.environ.get(name, "0").lower() in ("1", "true", "yes", "on")


def _extensions():
    if _env_flag("SPECDEC_NO_EXTENSION"):
        return [], {}
    try:
        import torch
        from torch.utils import cpp_extension
    except Exception as exc:  # torch missing from the build environment
        warnings.warn(
            f"specdec_kernels: torch not importable at build time ({exc}); "
            "building without the C++ extension",
            stacklevel=2,
        )
        return [], {}

    cpp_sources = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    cu_sources = sorted(glob.glob(os.path.join("csrc", "**", "*.cu"), recursive=True))
    if not cpp_sources:
        return [], {}

    sanitize = _env_flag("SPECDEC_SANITIZE")
    use_cuda = (
        not _env_flag("SPECDEC_NO_CUDA")
        and not sanitize
        and bool(cu_sources)
        and torch.version.cuda is not None
        and cpp_extension.CUDA_HOME is not None
    )
    # torch >= 2.10 headers are C++20; older ones C++17.
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    std = "-std=c++20" if (major, minor) >= (2, 10) else "-std=c++17"
    # -g0: no debug information (Python's own CFLAGS carry -g): a third of the compile time and a
    # tenth of the library (2 MB, not 26); SPECDEC_SANITIZE puts -g back below
    cxx_flags = ["-O3", std, "-g0"]
    link_flags = []
    define_macros = []
    if sys.platform != "win32":
        cxx_flags.append("-fopenmp")
        link_flags.append("-fopenmp")
    if sanitize:
        # Later flags win over Python's own -O3 / -fwrapv (with -fwrapv signed overflow is defined
        # behaviour, and UBSan would not report it).
        sanitizers = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
        cxx_flags += ["-O1", "-g", "-fno-omit-frame-pointer", "-fno-wrapv"] + sanitizers
        link_flags += sanitizers
    if use_cuda:
        define_macros.append(("SPECDEC_WITH_CUDA", None))
        nvcc_flags = ["-O3", std, "--expt-relaxed-constexpr"]
        ext = cpp_extension.CUDAExtension(
            "specdec_kernels._C",
            sources=cpp_sources + cu_sources,
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
            extra_link_args=link_flags,
        )
    else:
        ext = cpp_extension.CppExtension(
            "specdec_kernels._C",
            sources=cpp_sources,
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx_flags},
            extra_link_args=link_flags,
        )

    class BuildExtOptional(cpp_extension.BuildExtension):
        """Build the extension, but warn instead of failing the install."""

        def run(self):
            try:
                super().run()
            except Exception as exc:  # compiler missing or broken
                warnings.warn(
                    f"specdec_kernels: C++ extension build failed ({exc}); "
                    "the pure-PyTorch fallback will be used",
                    stacklevel=2,
                )

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as exc:
                warnings.warn(
                    f"specdec_kernels: building {ext.name} failed ({exc}); "
                    "the pure-PyTorch fallback will be used",
                    stacklevel=2,
                )

    # ninja compiles the sources in parallel where it is installed (torch falls back to one at a
    # time, with a warning, where it is not); MAX_JOBS caps its jobs
    return [ext], {"build_ext": BuildExtOptional.with_options(use_ninja=True)}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
