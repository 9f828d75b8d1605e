"""OCR reward with RapidOCR's PP-OCRv4 text recogniser, restricted to a small alphabet.

Only the recognition ONNX model shipped inside the `rapidocr_onnxruntime` wheel runs (nothing is
downloaded): the whole image is one text line. Pre-processing follows RapidOCR's
`TextRecognizer.resize_norm_img`: resize to height 48 keeping the aspect ratio (bilinear), scale
to [−1, 1], right-pad with 0 to the batch width (≥ 320 px). The model outputs a softmax over
6625 classes: index 0 = CTC blank, 1..6623 = the characters listed in the model's ONNX metadata
key ``character`` (one per line), 6624 = space. CTC greedy decoding (Graves et al. 2006) over
blank + the task alphabet only (every other class is masked) removes the junk characters the
Chinese+English recogniser adds at the edges of tiny crops (demo-task.md). The reward is
Flow-GRPO's OCR rule (`omnirl.scorers.text.ocr_reward`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

from omnirl.scorers.base import ScorerError, check_batch, check_rewards
from omnirl.scorers.text import ocr_reward, read_target

REC_HEIGHT = 48
REC_MIN_WIDTH = 320
"""RapidOCR's rec_img_shape [3, 48, 320]: batches are padded to at least this width."""


def recognizer_model_path() -> Path:
    """Path of ch_PP-OCRv4_rec_infer.onnx inside the installed rapidocr_onnxruntime package.

    Raises:
        FileNotFoundError: the package or the model file is missing (``pip install rapidocr-onnxruntime``).
    """
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("rapidocr_onnxruntime is not installed; pip install rapidocr-onnxruntime>=1.4")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / "ch_PP-OCRv4_rec_infer.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; reinstall rapidocr-onnxruntime (it ships the model in the wheel)")
    return path


def preprocess(images: np.ndarray) -> np.ndarray:
    """`[B, H, W, 3]` uint8 RGB → `[B, 3, 48, W']` float32 recogniser input (grayscale in 3 channels).

    W' = max(320, ceil(48·W/H)); values (pixel/255 − 0.5)/0.5, padding 0 (RapidOCR's rule).
    """
    b, h, w, _ = images.shape
    resized_w = math.ceil(REC_HEIGHT * w / h)
    batch = np.zeros((b, 3, REC_HEIGHT, max(REC_MIN_WIDTH, resized_w)), dtype=np.float32)
    for i in range(b):
        gray = Image.fromarray(images[i]).convert("L").resize((resized_w, REC_HEIGHT), Image.BILINEAR)
        batch[i, :, :, :resized_w] = (np.asarray(gray, dtype=np.float32) / 255.0 - 0.5) / 0.5
    return batch


def ctc_greedy_decode(probs: np.ndarray, class_ids: np.ndarray, alphabet: str) -> list[str]:
    """Greedy CTC decoding restricted to blank + `alphabet`.

    Args:
        probs: `[B, T, C]` class probabilities (index 0 = blank).
        class_ids: `[len(alphabet)]` model class index of each alphabet character.
        alphabet: the allowed characters.
    Returns:
        B strings: per-frame argmax over {blank} ∪ alphabet, repeats merged, blanks removed.
    """
    allowed = np.concatenate([[0], class_ids])
    best = probs[:, :, allowed].argmax(axis=2)  # [B, T], 0 = blank, k ≥ 1 = alphabet[k − 1]
    texts = []
    for row in best:
        keep = np.ones(len(row), dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        texts.append("".join(alphabet[k - 1] for k in row[keep & (row != 0)]))
    return texts


class OCRScorer:
    """Flow-GRPO OCR reward read by PP-OCRv4's recogniser over a restricted alphabet.

    Args:
        alphabet: characters the reading may contain (default the digits).
        threads: onnxruntime intra-op threads.
        batch_size: images per recogniser call.
    Raises:
        ValueError: an alphabet character the recogniser does not know.
        FileNotFoundError: the recogniser model is not installed.
    """

    name = "ocr"

    def __init__(self, alphabet: str = "0123456789", threads: int = 1, batch_size: int = 64) -> None:
        if batch_size < 1 or threads < 1:
            raise ValueError(f"batch_size ({batch_size}) and threads ({threads}) must be >= 1")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(recognizer_model_path()), options, providers=["CPUExecutionProvider"])
        characters = self.session.get_modelmeta().custom_metadata_map["character"].splitlines()
        index = {ch: i + 1 for i, ch in enumerate(characters)}  # class 0 is the CTC blank
        index[" "] = len(characters) + 1
        missing = [ch for ch in alphabet if ch not in index]
        if missing or not alphabet:
            raise ValueError(f"alphabet: {alphabet!r} has characters the PP-OCRv4 recogniser does not know: {missing}; "
                             "remove them (it reads digits, Latin letters, common punctuation and Chinese)")
        self.alphabet = alphabet
        self.class_ids = np.array([index[ch] for ch in alphabet], dtype=np.int64)
        self.batch_size = batch_size
        self._input = self.session.get_inputs()[0].name

    def read(self, images: np.ndarray) -> list[str]:
        """Recognised text of each image `[B, H, W, 3]` uint8 (restricted to the alphabet)."""
        texts: list[str] = []
        for start in range(0, images.shape[0], self.batch_size):
            batch = preprocess(images[start : start + self.batch_size])
            probs = self.session.run(None, {self._input: batch})[0]
            texts.extend(ctc_greedy_decode(probs, self.class_ids, self.alphabet))
        return texts

    def score_with_texts(
        self, images: np.ndarray, prompts: list[str], sample_ids: list[str]
    ) -> tuple[np.ndarray, list[str]]:
        """Rewards `[B]` float32 in [0, 1] and the B decoded readings.

        Raises:
            ScorerError: malformed images, a prompt without a usable target, or a recogniser failure.
        """
        check_batch(images, prompts, sample_ids)
        targets = [read_target(prompt, sample_id) for prompt, sample_id in zip(prompts, sample_ids, strict=True)]
        try:
            texts = self.read(images)
        except Exception as err:  # onnxruntime raises its own exception types
            raise ScorerError(sample_ids[0] if sample_ids else "", f"OCR recogniser failed: {err}") from err
        rewards = np.array([ocr_reward(t, r) for t, r in zip(targets, texts, strict=True)], dtype=np.float32)
        return check_rewards(rewards, sample_ids), texts

    def score(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """Rewards `[B]` float32 in [0, 1] (see `score_with_texts`)."""
        return self.score_with_texts(images, prompts, sample_ids)[0]
