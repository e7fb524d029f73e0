from ..builder import CUDAOpBuilder


class TransducerBuilder(CUDAOpBuilder):
    """RNN-T joint and loss (apex.contrib.transducer; transducer_joint_cuda, transducer_loss_cuda), CPU and CUDA."""

    NAME = "transducer"
