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

An image over ``own_size_pixels`` is post-processed on the detector's input instead (the masks
cut to the image, not upsampled again): its boxes scaled back to the image's pixels, its kept
masks on the resized image the detector saw. The cost is then the detector's, whatever the
canvas: a 4096 x 4096 image's 100 masks upsampled to its own size were 1.7 G logits.

Imported by ``setup`` only (torch and transformers).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Mask2FormerForUniversalSegmentation

from common.models.hub import local_first
from services.geneval.settings import OWN_SIZE_PIXELS

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
    """The detections of one image above its threshold, in the detector's order, and the masks
    of the mask labels' most confident on the grid they were made on: the image's own pixels,
    or (an image over ``own_size_pixels``) the detector's resized input, ``canvas``."""

    labels: np.ndarray  # (N,) int64
    confidences: np.ndarray  # (N,) float32
    boxes: np.ndarray  # (N, 4) float32 x1, y1, x2, y2 (exclusive), the image's pixels
    masks: dict[int, np.ndarray]  # detection index -> (h, w) bool on the grid
    grid_boxes: np.ndarray  # (N, 4) float32: the boxes on the grid (``boxes`` when it is the image's)
    canvas: np.ndarray | None = None  # (h, w, 3) uint8: the resized input, when the masks are on it


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
        self,
        source: str,
        device: str,
        dtype: torch.dtype,
        min_size: int,
        max_size: int,
        max_detections: int,
        bgr: bool,
        own_size_pixels: int = OWN_SIZE_PIXELS,
    ) -> None:
        model = local_first(
            lambda offline: Mask2FormerForUniversalSegmentation.from_pretrained(source, local_files_only=offline)
        )
        self.num_classes = int(model.config.num_labels)
        self.model = model.to(device, dtype).eval()
        self.device, self.dtype = device, dtype
        self.min_size, self.max_size, self.max_detections, self.bgr = min_size, max_size, max_detections, bgr
        self.own_size_pixels = own_size_pixels
        self.mean = torch.tensor(MEAN, device=device).view(3, 1, 1)
        self.std = torch.tensor(STD, device=device).view(3, 1, 1)

    def own_size(self, height: int, width: int) -> bool:
        """Whether an image's masks are upsampled to its own size, as mmdet does (else they stay
        on the detector's input)."""
        return height * width <= self.own_size_pixels

    def _input(self, pixels: np.ndarray) -> tuple[torch.Tensor, tuple[int, int], torch.Tensor]:
        """An image resized as mmcv does (bilinear, rounded back to uint8), padded with grey to a
        multiple of 32 and normalised; its size before the padding; the resized RGB image (3, h, w)."""
        height, width = pixels.shape[:2]
        new_width, new_height = scaled_size(width, height, self.min_size, self.max_size)
        image = torch.from_numpy(pixels).to(self.device).permute(2, 0, 1)[None].float()
        if (new_height, new_width) != (height, width):
            image = F.interpolate(image, size=(new_height, new_width), mode="bilinear", align_corners=False)
            image = image.round().clamp(0, 255)
        resized = image[0]
        image = resized.flip(0) if self.bgr else resized
        bottom, right = -new_height % SIZE_DIVISOR, -new_width % SIZE_DIVISOR
        image = F.pad(image, (0, right, 0, bottom), value=PAD_LEVEL)
        return (image - self.mean) / self.std, (new_height, new_width), resized

    @torch.inference_mode()
    def __call__(self, batch: Sequence[DetectorInput]) -> list[Detections]:
        inputs = [self._input(item.pixels) for item in batch]
        height = max(x.shape[1] for x, _, _ in inputs)
        width = max(x.shape[2] for x, _, _ in inputs)
        padded = torch.zeros((len(inputs), 3, height, width), device=self.device)
        for index, (x, _, _) in enumerate(inputs):
            padded[index, :, : x.shape[1], : x.shape[2]] = x
        out = self.model(pixel_values=padded.to(self.dtype))
        results = []
        for index, item in enumerate(batch):
            logits = out.class_queries_logits[index].float()
            masks = out.masks_queries_logits[index : index + 1].float()
            _, shape, resized = inputs[index]
            found = self._instances(logits, masks, shape, (height, width), item)
            if found.masks and not self.own_size(*item.pixels.shape[:2]):
                canvas = resized.to(torch.uint8).permute(1, 2, 0).cpu().numpy()
                found = Detections(found.labels, found.confidences, found.boxes, found.masks, found.grid_boxes, canvas)
            results.append(found)
        return results

    def _instances(
        self,
        logits: torch.Tensor,
        mask_logits: torch.Tensor,
        shape: tuple[int, int],
        padded: tuple[int, int],
        item: DetectorInput,
    ) -> Detections:
        height, width = item.pixels.shape[:2]
        grid = (height, width) if self.own_size(height, width) else shape
        scores = logits.softmax(dim=-1)[:, :-1]
        top_scores, top = scores.flatten().topk(min(self.max_detections, scores.numel()), sorted=False)
        labels, queries = top % self.num_classes, top // self.num_classes
        # A mask's score and box are its query's: each query's mask is made once, whatever the
        # number of its classes among the top ones.
        distinct, of_query = queries.unique(return_inverse=True)
        mask_scores = top_scores.new_empty(len(distinct))
        grid_boxes = top_scores.new_empty((len(distinct), 4))
        for rows, chosen in self._masks(mask_logits, distinct, shape, padded, grid):
            binary = chosen > 0
            inside = binary.flatten(1).float()
            mask_scores[rows] = (chosen.sigmoid().flatten(1) * inside).sum(1) / (inside.sum(1) + 1e-6)
            grid_boxes[rows] = mask_boxes(binary)
        confidences = top_scores * mask_scores[of_query]
        keep = confidences > item.threshold  # in float32, as the rules compare
        labels, confidences, queries = labels[keep], confidences[keep], queries[keep]
        grid_boxes = grid_boxes[of_query[keep]]
        scale = grid_boxes.new_tensor((width / grid[1], height / grid[0])).repeat(2)
        boxes = grid_boxes if grid == (height, width) else grid_boxes * scale
        labels_np = labels.cpu().numpy()
        confidences_np = confidences.cpu().numpy().astype(np.float32)
        wanted_rows: list[int] = []
        for label in item.mask_labels:
            rows = np.flatnonzero(labels_np == label)
            # most confident first, of equal ones the later, as the rules order them
            rows = rows[::-1][np.argsort(-confidences_np[rows[::-1]], kind="stable")][: item.mask_limit]
            wanted_rows.extend(rows.tolist())
        wanted: dict[int, np.ndarray] = {}
        for rows, chosen in self._masks(mask_logits, queries[wanted_rows], shape, padded, grid):
            for row, mask in zip(wanted_rows[rows], (chosen > 0).cpu().numpy()):
                wanted[row] = mask
        return Detections(labels_np, confidences_np, boxes.cpu().numpy(), wanted, grid_boxes.cpu().numpy())

    def _masks(
        self,
        mask_logits: torch.Tensor,
        queries: torch.Tensor,
        shape: tuple[int, int],
        padded: tuple[int, int],
        size: tuple[int, int],
    ) -> Iterator[tuple[slice, torch.Tensor]]:
        """The mask logits of ``queries`` as mmdet upsamples them (to the padded input, cut to the
        image, to ``size``: the image's own, or ``shape``, where they already are),
        ``MASK_CHUNK`` logits at a time: (rows, masks) pairs."""
        step = max(1, MASK_CHUNK // max(size[0] * size[1], padded[0] * padded[1]))
        for start in range(0, len(queries), step):
            rows = slice(start, start + step)
            masks = F.interpolate(mask_logits[:, queries[rows]], size=padded, mode="bilinear", align_corners=False)
            masks = masks[:, :, : shape[0], : shape[1]]
            if size != shape:
                masks = F.interpolate(masks, size=size, mode="bilinear", align_corners=False)
            yield rows, masks[0]
