"""Cast lists for `torch.nn.functional` (which the torch.nn layers call).

F.instance_norm / F.batch_norm are absent on purpose: they take fp16 input with fp32 weights
directly. F.normalize and F.cosine_similarity call norms internally but are listed anyway, in case
their implementation changes.
"""
import torch.nn.functional

MODULE = torch.nn.functional

FP16_FUNCS = [
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc",
    "linear",
]

BFLOAT16_FUNCS = list(FP16_FUNCS)

FP32_FUNCS = [
    # interpolation
    "interpolate", "grid_sample",
    # pointwise
    "softplus", "softmin", "log_softmax", "softmax", "gelu",
    # normalization
    "layer_norm", "group_norm", "local_response_norm", "normalize", "cosine_similarity",
    # losses
    "poisson_nll_loss", "cosine_embedding_loss", "cross_entropy", "hinge_embedding_loss", "kl_div",
    "l1_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss",
    "multi_margin_loss", "nll_loss", "binary_cross_entropy_with_logits", "smooth_l1_loss",
    "soft_margin_loss", "triplet_margin_loss", "ctc_loss",
]

# (name, advice): calling one with fp16/bf16 input raises NotImplementedError(advice), unless
# amp.init(allow_banned=True), which runs it in fp32 instead.
BANNED_FUNCS = [
    ("binary_cross_entropy",
     "\namp refuses F.binary_cross_entropy / torch.nn.BCELoss on fp16 or bf16 input: the log of a "
     "probability that rounded to 0 or 1 in low precision is infinite.\n"
     "Usually a Sigmoid comes right before the BCELoss; replace the pair by torch.nn.BCEWithLogitsLoss "
     "(or F.binary_cross_entropy_with_logits), which amp runs in fp32.\n"
     "Or run the sigmoid in fp32 by calling\n"
     "    amp.register_float_function(torch, 'sigmoid')\n"
     "before amp.init() / amp.initialize().\n"
     "To run binary_cross_entropy in fp32 regardless, pass allow_banned=True to amp.init()."),
]
