"""An ONNX graph run by torch: the weights and the node list of an ``.onnx`` file, executed node
by node with torch operators, on any device and in float32, float16 or bfloat16.

Written for the PP-OCRv4 detector and recognizer that RapidOCR's wheel ships (opset 12, weights
stored as ``Constant`` nodes); it covers exactly the operators those two graphs use and refuses
any other by name when the model is loaded, so a model it cannot run fails at start, never
mid-request. Converters (onnx2torch) were not usable here: onnx2torch could not infer a rank in
the recognizer and pulls in torchvision, which a bare GPU node does not have.

Integer tensors only ever carry shapes in these graphs: they stay on the CPU as int64, as small
Python-side values; floating tensors live on the model's device in the model's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

Op = Callable[[list[Any], dict[str, Any]], Any]

# ONNX TensorProto element types that appear in the two graphs' Cast nodes.
_ONNX_INT_TYPES = {6: torch.int32, 7: torch.int64}


def _ints(value: Any) -> list[int]:
    """A shape-like input (CPU tensor or list) as Python ints."""
    return [int(v) for v in (value.tolist() if isinstance(value, torch.Tensor) else value)]


def _conv_padding(pads: list[int]) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """ONNX ``pads`` (all begins, then all ends) as torch's symmetric padding, plus an explicit
    ``F.pad`` for the begins/ends that differ (None when symmetric)."""
    rank = len(pads) // 2
    begins, ends = pads[:rank], pads[rank:]
    if begins == ends:
        return tuple(begins), None
    explicit: list[int] = []
    for begin, end in zip(reversed(begins), reversed(ends)):  # F.pad: last dimension first
        explicit += [begin, end]
    return (0,) * rank, tuple(explicit)


def _conv_options(attrs: dict[str, Any]) -> dict[str, Any]:
    """Stride, dilation and groups: ONNX's Conv and ConvTranspose attributes, and their defaults."""
    return {"stride": attrs.get("strides", 1), "dilation": attrs.get("dilations", 1), "groups": attrs.get("group", 1)}


def _conv(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    x, weight, *bias = inputs
    padding, explicit = _conv_padding(attrs.get("pads", [0, 0, 0, 0]))
    if explicit is not None:
        x = F.pad(x, explicit)
    return F.conv2d(x, weight, bias[0] if bias else None, padding=padding, **_conv_options(attrs))


def _conv_transpose(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    x, weight, *bias = inputs
    padding, explicit = _conv_padding(attrs.get("pads", [0, 0, 0, 0]))
    if explicit is not None or attrs.get("output_padding") or attrs.get("output_shape"):
        raise NotImplementedError("ConvTranspose with asymmetric pads or an output shape")
    return F.conv_transpose2d(x, weight, bias[0] if bias else None, padding=padding, **_conv_options(attrs))


def _batch_norm(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    x, scale, bias, mean, var = inputs
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=attrs.get("epsilon", 1e-5))


def _clip(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    x, *bounds = inputs
    low, high = [*bounds, None, None][:2]
    return torch.clamp(x, low, high)


def _resize(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    x = inputs[0]
    mode = attrs.get("mode", b"nearest")
    transform = attrs.get("coordinate_transformation_mode", b"half_pixel")
    rounding = attrs.get("nearest_mode", b"round_prefer_floor")
    if (mode, transform, rounding) != (b"nearest", b"asymmetric", b"floor"):
        raise NotImplementedError(f"Resize {mode!r}/{transform!r}/{rounding!r}")
    factors = attrs["scales"]
    if factors[:2] != [1.0, 1.0] or any(f != int(f) for f in factors[2:]):
        raise NotImplementedError(f"Resize by {factors}")
    # Integer upscaling: torch's nearest (source = floor(dest / factor)) is ONNX's asymmetric floor.
    return F.interpolate(x, scale_factor=factors[2:], mode="nearest")


def _average_pool(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    padding, explicit = _conv_padding(attrs.get("pads", [0, 0, 0, 0]))
    if explicit is not None:
        raise NotImplementedError("AveragePool with asymmetric pads")
    return F.avg_pool2d(
        inputs[0],
        attrs["kernel_shape"],
        stride=attrs.get("strides", attrs["kernel_shape"]),
        padding=padding,
        ceil_mode=bool(attrs.get("ceil_mode", 0)),
        count_include_pad=bool(attrs.get("count_include_pad", 0)),
    )


def _slice(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    data, starts, ends, *rest = inputs
    axes = _ints(rest[0]) if rest else list(range(len(_ints(starts))))
    steps = _ints(rest[1]) if len(rest) > 1 else [1] * len(axes)
    index: list[slice] = [slice(None)] * data.dim()
    for axis, start, end, step in zip(axes, _ints(starts), _ints(ends), steps):
        if step != 1:
            raise NotImplementedError("Slice with a step")
        size = data.shape[axis]
        # ONNX clamps out-of-range bounds (e.g. INT64_MAX for "to the end"); Python slicing does too.
        index[axis] = slice(max(-size - 1, min(start, size)), max(-size - 1, min(end, size)))
    return data[tuple(index)]


def _reshape(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    x, shape = inputs
    wanted = [x.shape[i] if dim == 0 else dim for i, dim in enumerate(_ints(shape))]  # 0: keep that dimension
    return x.reshape(wanted)


def _softmax(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    """Opset < 13: the input is flattened to 2-D at ``axis`` and normalised over the second part."""
    x = inputs[0]
    axis = attrs.get("axis", 1) % x.dim()
    rows = math.prod(x.shape[:axis])
    return torch.softmax(x.reshape(rows, -1), dim=-1).reshape(x.shape)


def _reduce_mean(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    return inputs[0].mean(dim=attrs["axes"], keepdim=bool(attrs.get("keepdims", 1)))


def _squeeze(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    x = inputs[0]
    for axis in sorted((a % x.dim() for a in attrs["axes"]), reverse=True):
        x = x.squeeze(axis)
    return x


def _concat(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    return torch.cat(inputs, dim=attrs["axis"])


def _cast(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    if attrs["to"] not in _ONNX_INT_TYPES:
        raise NotImplementedError(f"Cast to ONNX type {attrs['to']}")
    return inputs[0].to(_ONNX_INT_TYPES[attrs["to"]])


def _hard_sigmoid(inputs: list[Any], attrs: dict[str, Any]) -> torch.Tensor:
    return torch.clamp(inputs[0] * attrs.get("alpha", 0.2) + attrs.get("beta", 0.5), 0.0, 1.0)


OPS: dict[str, Op] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "BatchNormalization": _batch_norm,
    "Clip": _clip,
    "Resize": _resize,
    "AveragePool": _average_pool,
    "Slice": _slice,
    "Reshape": _reshape,
    "Softmax": _softmax,
    "ReduceMean": _reduce_mean,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Cast": _cast,
    "HardSigmoid": _hard_sigmoid,
    "Add": lambda i, a: i[0] + i[1],
    "Sub": lambda i, a: i[0] - i[1],
    "Mul": lambda i, a: i[0] * i[1],
    "Div": lambda i, a: i[0] / i[1],
    "Pow": lambda i, a: torch.pow(i[0], i[1]),
    "Sqrt": lambda i, a: torch.sqrt(i[0]),
    "MatMul": lambda i, a: torch.matmul(i[0], i[1]),
    "Relu": lambda i, a: torch.relu(i[0]),
    "Sigmoid": lambda i, a: torch.sigmoid(i[0]),
    "GlobalAveragePool": lambda i, a: i[0].mean(dim=(2, 3), keepdim=True),
    "Transpose": lambda i, a: i[0].permute(a["perm"]),
    "Shape": lambda i, a: torch.tensor(list(i[0].shape), dtype=torch.int64),
}


class OnnxGraph(torch.nn.Module):
    """One ONNX model as a torch module: ``module(x)`` returns the graph's single output."""

    def __init__(self, path: str | Path) -> None:
        import onnx
        from onnx import numpy_helper

        super().__init__()
        model = onnx.load(str(path))
        graph = model.graph
        if len(graph.input) != 1 or len(graph.output) != 1:
            raise ValueError(f"{path}: expected one input and one output")
        self.input_name, self.output_name = graph.input[0].name, graph.output[0].name
        self.floats = torch.nn.ParameterDict()  # float weights: follow .to(device, dtype)
        self.shapes: dict[str, torch.Tensor] = {}  # integer constants: shapes, stay on the CPU
        self._names: dict[str, str] = {}  # ONNX name -> ParameterDict key (keys cannot hold dots)
        arrays = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        self.nodes: list[tuple[str, list[str], list[str], dict[str, Any]]] = []
        for node in graph.node:
            if node.op_type == "Constant":
                arrays[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
                continue
            if node.op_type not in OPS:
                raise NotImplementedError(f"{path}: ONNX operator {node.op_type} is not supported")
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if node.op_type == "Resize":  # constant scales, read once here rather than from the device per call
                if len(node.input) != 3 or node.input[2] not in arrays:
                    raise NotImplementedError(f"{path}: Resize without constant scales")
                attrs["scales"] = [float(s) for s in arrays[node.input[2]].tolist()]
            self.nodes.append((node.op_type, list(node.input), list(node.output), attrs))
        for name, array in arrays.items():
            self._add_constant(name, array)
        # After each node, the intermediate values no later node reads: freed as the graph runs,
        # so memory holds the live activations only (all of them at once: many GB for a batch).
        last_use = {name: index for index, (_, inputs, _, _) in enumerate(self.nodes) for name in inputs}
        last_use[self.output_name] = len(self.nodes)
        self._dead_after: list[list[str]] = [[] for _ in self.nodes]
        for name, index in last_use.items():
            if index < len(self.nodes) and name not in arrays:
                self._dead_after[index].append(name)

    def _add_constant(self, name: str, array: np.ndarray) -> None:
        tensor = torch.from_numpy(np.array(array))
        if tensor.is_floating_point():
            key = f"c{len(self._names)}"
            self._names[name] = key
            self.floats[key] = torch.nn.Parameter(tensor, requires_grad=False)
        else:
            self.shapes[name] = tensor.to(torch.int64)

    def _value(self, name: str, values: dict[str, Any]) -> Any:
        if name == "":
            return None  # an omitted optional input
        if name in values:
            return values[name]
        if name in self._names:
            return self.floats[self._names[name]]
        return self.shapes[name]

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values: dict[str, Any] = {self.input_name: x}
        for (op, inputs, outputs, attrs), dead in zip(self.nodes, self._dead_after):
            values[outputs[0]] = OPS[op]([self._value(name, values) for name in inputs], attrs)
            for name in dead:
                values.pop(name, None)
        return values[self.output_name]
