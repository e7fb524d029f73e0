from op_builder.builder import CUDAOpBuilder


class AmpCBuilder(CUDAOpBuilder):
    """Multi-tensor kernels: fused Adam/LAMB/SGD/NovoGrad/Adagrad steps, amp unscale, grad L2 norms."""

    NAME = "amp_C"
    CPP_SOURCES = [
        "multi_tensor/binding.cpp",
        "multi_tensor/schema.cpp",
        "multi_tensor/scale_cpu.cpp",
        "multi_tensor/l2norm_cpu.cpp",
        "multi_tensor/adam_cpu.cpp",
        "multi_tensor/sgd_cpu.cpp",
        "multi_tensor/lamb_cpu.cpp",
    ]
    CUDA_SOURCES = [
        "multi_tensor/scale_cuda.cu",
        "multi_tensor/l2norm_cuda.cu",
        "multi_tensor/adam_cuda.cu",
        "multi_tensor/sgd_cuda.cu",
        "multi_tensor/lamb_cuda.cu",
    ]
