"""Names shared by the suite's modules, kept free of TensorFlow so that ``compare`` starts instantly."""

FAMILIES = ("dense", "conv", "mlp", "betainc", "owens_t", "corpus", "fast_scale", "fast_defect")

CONTENDERS = ("fastcheck_cold", "fastcheck_warm", "compute_gradient", "loop", "hand_batched_cold", "hand_batched_warm",
              "reference")
TITLES = {
    "fastcheck_cold": "fastcheck cold",
    "fastcheck_warm": "fastcheck warm",
    "hand_batched_cold": "hand-batched cold",
    "hand_batched_warm": "hand-batched warm",
    "compute_gradient": "tf.test.compute_gradient",
    "loop": "element loop",
    "reference": "reference (2k fwd + VJP + JVP)",
}
# What each contender's time is divided by (the fastcheck measurement of the
# same kind, same problem, same run): stateless contenders and cold calls are
# compared with a cold check, the warm hand-batched limit with a warm check.
BASELINE = {
    "hand_batched_cold": "fastcheck_cold",
    "hand_batched_warm": "fastcheck_warm",
    "compute_gradient": "fastcheck_cold",
    "loop": "fastcheck_cold",
    "reference": "fastcheck_cold",
}
FASTCHECK = ("fastcheck_cold", "fastcheck_warm")
# Probes fastcheck's fast mode uses by default (check_gradients(probes=4)): the
# "reference" contender of the fast-mode problems costs 2 * PROBES forward calls.
PROBES = 4
