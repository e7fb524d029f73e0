"""transducer_joint_cuda: NVIDIA apex's RNN-T joint module (forward, backward), compiled on first attribute access."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__, library="transducer", prefix="transducer_joint_",
                                   adapters="apex.contrib.transducer._historical_joint")
