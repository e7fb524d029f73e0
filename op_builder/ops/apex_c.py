from op_builder.builder import CppOpBuilder


class ApexCBuilder(CppOpBuilder):
    """flatten / unflatten of dense tensor lists (DDP buckets, combined grads)"""

    NAME = "apex_C"
    CPP_SOURCES = ["apex_C/flatten_unflatten.cpp"]
