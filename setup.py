"""The compiled part of the package: cslm/_native, the C++ CSLM evaluator behind `cslm serve` on a CPU
(cslm/cpp/cslm_native.cc, loaded by cslm/native.py through ctypes). Everything else is in pyproject.toml.

Optional: where no C++ compiler is found the install goes on without it, and the server scores with torch."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class build_plain_library(build_ext):
    """The library is loaded by ctypes, not imported: it needs no Python headers and exports no PyInit_."""

    def get_export_symbols(self, ext):
        return ext.export_symbols


CPP = "cslm/cpp/"
native = Extension("cslm._native", sources=[CPP + f for f in ("cslm_native.cc", "cslm_local.cc", "cslm_kernels.cc",
                                                               "cslm_modeldir.cc", "cslm_json.cc")],
                   depends=[CPP + f for f in ("cslm_local.h", "cslm_kernels.h", "cslm_modeldir.h", "cslm_json.h")],
                   language="c++",
                   extra_compile_args=["-std=c++11", "-O2", "-pthread"], extra_link_args=["-pthread"],
                   optional=True)  # no compiler: a warning, and the install goes on without it
setup(ext_modules=[native], cmdclass={"build_ext": build_plain_library})
