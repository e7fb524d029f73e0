from ..builder import CppOpBuilder


class ApexCBuilder(CppOpBuilder):
    """flatten / unflatten of dense tensor lists (DDP buckets, combined grads)"""

    NAME = "apex_C"
