"""Runs one build in a child process: `python -m op_builder._build_child <spec.json>`.

The build happens out of process so that (1) its compiler output can be captured
whole into the log, (2) importing the fresh module to check that it loads does
not register its ops in the parent, which loads the published copy instead, and
(3) a build interrupted by the parent's death dies with it.
"""
import json
import sys


def main(spec_path: str) -> None:
    spec = json.load(open(spec_path))
    from torch.utils.cpp_extension import load

    load(name=spec["name"], sources=spec["sources"], extra_cflags=spec["cxx_flags"],
         extra_cuda_cflags=spec["nvcc_flags"], extra_include_paths=spec["include_dirs"],
         build_directory=spec["build_dir"], with_cuda=spec["with_gpu"], verbose=True, is_python_module=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except Exception as error:  # the parent turns this log into an OpBuildError
        print(f"\n{type(error).__name__}: {error}", flush=True)
        sys.exit(1)
