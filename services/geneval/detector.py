"""The object detector: a transformers Mask2Former with mmdet 2.x's test pipeline and instance
post-processing, as GenEval runs ``mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco``.

mmdet 2.28's pipeline for this config: the image resized (bilinear) to fit ``min_size`` x
``max_size`` with its aspect kept, padded with grey (128) to a multiple of 32, normalised with
ImageNet's statistics; a batch of several sizes zero-padded (after normalising) to its largest.
Its post-processing (``MaskFormerFusionHead.instance_postprocess``): the last decoder layer's
mask logits upsampled to the padded input, cut to the image, upsampled to the image's own
size; the class probabilities (softmax, the no-object class dropped) of every query x class,
the ``max_detections`` highest; each one's mask the query's logits above 0, its confidence
the class probability times the mean sigmoid inside the mask, its box the mask's extent.

Imported by ``setup`` only (torch and transformers).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Mask2FormerForUniversalSegmentation

from services.clip.weights import local_first

# Mask logits (queries x pixels) upsampled at once in the post-processing: 100 queries' masks at
# a 16-Mpx image's size would be 6.4 GB a copy; in chunks, at most 32 MB a copy on any image.
MASK_CHUNK = 1 << 23
MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)
SIZE_DIVISOR = 32
PAD_LEVEL = 128.0  # the config's Pad(pad_val=128), before Normalize


@dataclass(frozen=True)
class DetectorInput:
    """One image for the detector: its RGB pixels (H, W, 3) uint8, the confidence a detection
    must pass to come back, and the labels whose masks come back (the colour clauses')."""

    pixels: np.ndarray
    threshold: float
    mask_labels: frozenset[int]
    mask_limit: int


@dataclass(frozen=True)
class Detections:
    """The detections of one image above its threshold, in the detector's order."""

    labels: np.ndarray  # (N,) int64
    confidences: np.ndarray  # (N,) float32
    boxes: np.ndarray  # (N, 4) float32 x1, y1, x2, y2 (exclusive), the image's pixels
    masks: dict[int, np.ndarray]  # detection index -> (H, W) bool, for the mask labels' most confident


def scaled_size(width: int, height: int, min_size: int, max_size: int) -> tuple[int, int]:
    """mmcv's ``rescale_size``: the largest scale fitting the long edge in ``max_size`` and the
    short one in ``min_size``, each edge rounded."""
    scale = min(max_size / max(width, height), min_size / min(width, height))
    return int(width * scale + 0.5), int(height * scale + 0.5)


def mask_boxes(masks: torch.Tensor) -> torch.Tensor:
    """mmdet's ``mask2bbox``: (x first, y first, x last + 1, y last + 1) of each mask, 0s for an empty one."""
    count, height, width = masks.shape
    boxes = masks.new_zeros((count, 4), dtype=torch.float32)
    if count == 0:
        return boxes
    xs, ys = masks.any(dim=1), masks.any(dim=2)
    x_index = torch.arange(width, device=masks.device)
    y_index = torch.arange(height, device=masks.device)
    x0 = torch.where(xs, x_index, width).amin(dim=1)
    x1 = torch.where(xs, x_index, -1).amax(dim=1) + 1
    y0 = torch.where(ys, y_index, height).amin(dim=1)
    y1 = torch.where(ys, y_index, -1).amax(dim=1) + 1
    found = xs.any(dim=1) & ys.any(dim=1)
    boxes[found] = torch.stack([x0, y0, x1, y1], dim=1)[found].float()
    return boxes


class Detector:
    """A Mask2Former on one device, mmdet's pipeline around it."""

    def __init__(
        self, source: str, device: str, dtype: torch.dtype, min_size: int, max_size: int, max_detections: int, bgr: bool
    ) -> None:
        model = local_first(
            lambda offline: Mask2FormerForUniversalSegmentation.from_pretrained(source, local_files_only=offline)
        )
        self.num_classes = int(model.config.num_labels)
        self.model = model.to(device, dtype).eval()
        self.device, self.dtype = device, dtype
        self.min_size, self.max_size, self.max_detections, self.bgr = min_size, max_size, max_detections, bgr
        self.mean = torch.tensor(MEAN, device=device).view(3, 1, 1)
        self.std = torch.tensor(STD, device=device).view(3, 1, 1)

    def _input(self, pixels: np.ndarray) -> tuple[torch.Tensor, tuple[int, int]]:
        """An image resized as mmcv does (bilinear, rounded back to uint8), padded with grey to a
        multiple of 32 and normalised; and its size before the padding."""
        height, width = pixels.shape[:2]
        new_width, new_height = scaled_size(width, height, self.min_size, self.max_size)
        image = torch.from_numpy(pixels).to(self.device).permute(2, 0, 1)[None].float()
        if (new_height, new_width) != (height, width):
            image = F.interpolate(image, size=(new_height, new_width), mode="bilinear", align_corners=False)
            image = image.round().clamp(0, 255)
        image = image[0]
        if self.bgr:
            image = image.flip(0)
        bottom, right = -new_height % SIZE_DIVISOR, -new_width % SIZE_DIVISOR
        image = F.pad(image, (0, right, 0, bottom), value=PAD_LEVEL)
        return (image - self.mean) / self.std, (new_height, new_width)

    @torch.inference_mode()
    def __call__(self, batch: Sequence[DetectorInput]) -> list[Detections]:
        inputs = [self._input(item.pixels) for item in batch]
        height = max(x.shape[1] for x, _ in inputs)
        width = max(x.shape[2] for x, _ in inputs)
        padded = torch.zeros((len(inputs), 3, height, width), device=self.device)
        for index, (x, _) in enumerate(inputs):
            padded[index, :, : x.shape[1], : x.shape[2]] = x
        out = self.model(pixel_values=padded.to(self.dtype))
        results = []
        for index, item in enumerate(batch):
            logits = out.class_queries_logits[index].float()
            masks = out.masks_queries_logits[index : index + 1].float()
            results.append(self._instances(logits, masks, inputs[index][1], (height, width), item))
        return results

    def _instances(
        self,
        logits: torch.Tensor,
        mask_logits: torch.Tensor,
        shape: tuple[int, int],
        padded: tuple[int, int],
        item: DetectorInput,
    ) -> Detections:
        size = item.pixels.shape[:2]
        scores = logits.softmax(dim=-1)[:, :-1]
        top_scores, top = scores.flatten().topk(min(self.max_detections, scores.numel()), sorted=False)
        labels, queries = top % self.num_classes, top // self.num_classes
        mask_scores = torch.empty_like(top_scores)
        boxes = top_scores.new_empty((len(top), 4))
        for rows, chosen in self._masks(mask_logits, queries, shape, padded, size):
            binary = chosen > 0
            inside = binary.flatten(1).float()
            mask_scores[rows] = (chosen.sigmoid().flatten(1) * inside).sum(1) / (inside.sum(1) + 1e-6)
            boxes[rows] = mask_boxes(binary)
        confidences = top_scores * mask_scores
        keep = confidences > item.threshold  # in float32, as the rules compare
        labels, confidences, boxes, queries = labels[keep], confidences[keep], boxes[keep], queries[keep]
        labels_np = labels.cpu().numpy()
        confidences_np = confidences.cpu().numpy().astype(np.float32)
        wanted_rows: list[int] = []
        for label in item.mask_labels:
            rows = np.flatnonzero(labels_np == label)
            # most confident first, of equal ones the later, as the rules order them
            rows = rows[::-1][np.argsort(-confidences_np[rows[::-1]], kind="stable")][: item.mask_limit]
            wanted_rows.extend(rows.tolist())
        wanted: dict[int, np.ndarray] = {}
        for rows, chosen in self._masks(mask_logits, queries[wanted_rows], shape, padded, size):
            for row, mask in zip(wanted_rows[rows], (chosen > 0).cpu().numpy()):
                wanted[row] = mask
        return Detections(labels_np, confidences_np, boxes.cpu().numpy(), wanted)

    def _masks(
        self,
        mask_logits: torch.Tensor,
        queries: torch.Tensor,
        shape: tuple[int, int],
        padded: tuple[int, int],
        size: tuple[int, int],
    ) -> Iterator[tuple[slice, torch.Tensor]]:
        """The mask logits of ``queries`` as mmdet upsamples them (to the padded input, cut to the
        image, to the image's own size), ``MASK_CHUNK`` logits at a time: (rows, masks) pairs."""
        step = max(1, MASK_CHUNK // max(size[0] * size[1], padded[0] * padded[1]))
        for start in range(0, len(queries), step):
            rows = slice(start, start + step)
            masks = F.interpolate(mask_logits[:, queries[rows]], size=padded, mode="bilinear", align_corners=False)
            masks = masks[:, :, : shape[0], : shape[1]]
            yield rows, F.interpolate(masks, size=size, mode="bilinear", align_corners=False)[0]
