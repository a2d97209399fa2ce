"""The tracer's rules as data: which TensorFlow ops it reads as what (``trace.Tracer``)."""

# Calls and control flow: their outputs are never constant-folded (``Tracer.constant``).
NO_FOLD = frozenset({"PartitionedCall", "StatefulPartitionedCall", "While", "StatelessWhile", "If", "StatelessIf"})

# Ops whose outputs never depend on input values.
NO_DEPENDENCE = frozenset({"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike", "BroadcastArgs",
                           "BroadcastGradientArgs", "NoOp"})
# Ops whose output is their first input in flat order (same elements, maybe another shape or dtype).
FLAT_IDENTITY = frozenset({"Identity", "Snapshot", "Reshape", "Squeeze", "ExpandDims", "EnsureShape", "StopGradient",
                           "PreventGradient", "CheckNumerics", "Cast", "Bitcast"})
# Element-wise ops, with numpy broadcasting of their inputs.
ELEMENTWISE = frozenset({
    # unary
    "Neg", "Abs", "Sign", "Square", "Sqrt", "Rsqrt", "Reciprocal", "Inv", "Exp", "Expm1", "Log", "Log1p",
    "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Tanh", "Asinh", "Acosh", "Atanh",
    "Sigmoid", "Relu", "Relu6", "Elu", "Selu", "Gelu", "LeakyRelu", "Softplus", "Softsign", "Erf", "Erfc", "Erfinv",
    "Lgamma", "Digamma", "Floor", "Ceil", "Round", "Rint", "IsFinite", "IsNan", "IsInf", "LogicalNot",
    # binary and more
    "Add", "AddV2", "Sub", "Mul", "MulNoNan", "Div", "RealDiv", "DivNoNan", "FloorDiv", "FloorMod", "TruncateDiv",
    "Maximum", "Minimum", "Pow", "SquaredDifference", "Atan2", "Xdivy", "Xlogy", "Xlog1py", "Igamma", "Igammac",
    "Less", "LessEqual", "Greater", "GreaterEqual", "Equal", "NotEqual", "LogicalAnd", "LogicalOr",
    "AddN", "Select", "SelectV2", "ClipByValue", "Fill", "Betainc",
    # the gradient kernels of element-wise ops, and special functions
    "TanhGrad", "SigmoidGrad", "SqrtGrad", "RsqrtGrad", "ReciprocalGrad", "InvGrad", "ReluGrad", "Relu6Grad",
    "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad", "SoftsignGrad", "GeluGrad",
    "BesselI0e", "BesselI1e", "BesselI0", "BesselI1", "Polygamma", "Zeta",
})
# Data-movement ops, replayed on element codes: op type -> the arguments that carry data.
MOVEMENT = {
    "Transpose": ("x",), "Slice": ("input",), "StridedSlice": ("input",), "ConcatV2": ("values",),
    "Pack": ("values",), "Unpack": ("value",), "Pad": ("input",), "PadV2": ("input", "constant_values"),
    "MirrorPad": ("input",), "Tile": ("input",), "GatherV2": ("params",), "GatherNd": ("params",),
    "ReverseV2": ("tensor",), "BroadcastTo": ("input",), "Split": ("value",), "SplitV": ("value",),
    "DepthToSpace": ("input",), "SpaceToDepth": ("input",), "Roll": ("input",),
}
# Reductions over constant axes (argument 1).
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "EuclideanNorm", "ArgMax", "ArgMin", "All", "Any"})
# Image resizing, channels last (``Tracer.resize``).
RESIZES = frozenset({"ResizeBilinear", "ResizeBicubic", "ResizeNearestNeighbor", "ResizeArea"})
# Convolutions and pooling: windows of the input (``Tracer.stencil``).
STENCILS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "AvgPool", "MaxPool", "AvgPool3D", "MaxPool3D"})
# Ops of a batch of matrices whose every output entry of a member reads (at most) the member's whole matrix
# (``Tracer.matrices``; a triangular solve, a Cholesky factor and eigh read one triangle: the whole member is a
# superset).
MATRIX_OPS = frozenset({"MatrixInverse", "MatrixDeterminant", "LogMatrixDeterminant", "MatrixSolve",
                        "MatrixTriangularSolve", "Cholesky", "SelfAdjointEigV2", "MatrixExponential"})
