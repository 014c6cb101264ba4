"""aiayn.visualization.image_attention and ``aiayn attention --image``: the class-token maps and
the attention rollout on hand examples and against transformers' own attention weights, the
overlays' geometry, the files and the page written, and the refusals."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

from aiayn.checkpoint import checkpoint_tokenizer, load_checkpoint
from aiayn.cli.main import main
from aiayn.data.images import ImagePreprocessor
from aiayn.models.vit import ViT
from aiayn.visualization.image_attention import (
    GREY_FLOOR,
    GRID_GREY,
    OVERLAY_ALPHA,
    OVERLAY_HUE,
    ImageAttention,
    attention_rollout,
    cls_attention,
    collect_image_attention,
    draw_overlays,
    image_attention_html,
    image_attention_pngs,
    overlay_heatmap,
    page_data,
    rollout_cls_map,
    top_predictions,
)

LABELS = {0: "cat", 1: "dog", 2: "fox"}
LAYERS, HEADS, GRID = 2, 4, (4, 4)  # image 32, patch 8
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny random HF ViT classifier (eager attention, weights ~ N(0, 0.3) so that the
    attention is far from uniform), converted with ``aiayn convert``, and a 40×30 PNG."""
    root = tmp_path_factory.mktemp("vit_attention")
    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=64, num_labels=3, id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()}, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = ViTForImageClassification(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0 if "layernorm" in name and name.endswith("weight") else 0.0, 0.3)
    hf.save_pretrained(root / "hf")
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(root / "hf")
    assert main(["convert", "--from-hf", str(root / "hf"), "--to", str(root / "ckpt")]) == 0
    y, x = np.mgrid[0:30, 0:40]  # a 40×30 pattern: stripes, a gradient and a bright square
    pattern = np.stack([(x * 6) % 256, (y * 8) % 256, ((x // 5 + y // 5) % 2) * 255], axis=-1)
    pattern[5:15, 20:32] = 255
    png = root / "pattern.png"
    Image.fromarray(pattern.astype(np.uint8), "RGB").save(png)
    return {"hf": hf, "ckpt": root / "ckpt", "png": png}


@pytest.fixture(scope="module")
def model_and_preprocessor(vit: dict[str, Any]) -> tuple[ViT, ImagePreprocessor]:
    checkpoint = load_checkpoint(vit["ckpt"], expect=ViT)
    preprocessor = checkpoint_tokenizer(checkpoint.path)
    assert isinstance(preprocessor, ImagePreprocessor)
    return checkpoint.model, preprocessor


@pytest.fixture(scope="module")
def attention(
    vit: dict[str, Any], model_and_preprocessor: tuple[ViT, ImagePreprocessor]
) -> ImageAttention:
    model, preprocessor = model_and_preprocessor
    return collect_image_attention(model, preprocessor, vit["png"])


@pytest.fixture(scope="module")
def hf_attentions(
    vit: dict[str, Any], model_and_preprocessor: tuple[ViT, ImagePreprocessor]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """transformers' eager attention weights (L × (n, T, T)) and probabilities on the same
    pixels."""
    _, preprocessor = model_and_preprocessor
    pixels = preprocessor.load(vit["png"])[None]  # (1, 3, 32, 32)
    with torch.no_grad():
        out = vit["hf"](pixel_values=pixels, output_attentions=True)
    return [a[0] for a in out.attentions], torch.softmax(out.logits[0], dim=-1)


# -- the pure computations on hand examples ------------------------------------------------------


def test_cls_attention_takes_the_class_row_over_the_patches() -> None:
    weights = torch.zeros(2, 5, 5)  # n = 2 heads, T = 1 + 2·2
    weights[0, 0] = torch.tensor([0.2, 0.1, 0.3, 0.15, 0.25])
    weights[1, 0] = torch.tensor([0.6, 0.0, 0.1, 0.1, 0.2])
    weights[:, 1:, 0] = 1.0  # other queries: not read
    maps = cls_attention(weights, (2, 2))
    assert maps.shape == (2, 2, 2)
    torch.testing.assert_close(maps[0], torch.tensor([[0.1, 0.3], [0.15, 0.25]]))
    torch.testing.assert_close(maps[1], torch.tensor([[0.0, 0.1], [0.1, 0.2]]))
    wide = cls_attention(torch.arange(16.0).reshape(1, 4, 4), (1, 3))  # a 1×3 grid
    torch.testing.assert_close(wide, torch.tensor([[[1.0, 2.0, 3.0]]]))
    with pytest.raises(ValueError, match="2×3 patch grid"):
        cls_attention(weights, (2, 3))


def test_rollout_of_identity_attention_keeps_every_token_on_itself() -> None:
    layers = [torch.eye(5).expand(3, 5, 5) for _ in range(4)]  # every head attends to itself
    rollout = attention_rollout(layers)
    torch.testing.assert_close(rollout, torch.eye(5))
    torch.testing.assert_close(rollout_cls_map(rollout, (2, 2)), torch.zeros(2, 2))


def test_rollout_two_layer_hand_example() -> None:
    # Layer 1: head mean A1 = [[1, 0], [0.6, 0.4]] -> Â1 = (A1 + I) / 2 = [[1, 0], [0.3, 0.7]].
    layer1 = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.2, 0.8]]])
    # Layer 2: head mean A2 = [[0.2, 0.8], [0, 1]] -> Â2 = [[0.6, 0.4], [0, 1]].
    layer2 = torch.tensor([[[0.0, 1.0], [0.0, 1.0]], [[0.4, 0.6], [0.0, 1.0]]])
    rollout = attention_rollout([layer1, layer2])
    # R = Â2 · Â1 = [[0.6 + 0.4·0.3, 0.4·0.7], [0.3, 0.7]] (Â1 · Â2 would be [[.6, .4], ...]).
    torch.testing.assert_close(rollout, torch.tensor([[0.72, 0.28], [0.3, 0.7]]))
    torch.testing.assert_close(rollout_cls_map(rollout, (1, 1)), torch.tensor([[0.28]]))
    torch.testing.assert_close(attention_rollout([layer1]), torch.tensor([[1.0, 0], [0.3, 0.7]]))
    with pytest.raises(ValueError, match="at least one layer"):
        attention_rollout([])


def test_top_predictions() -> None:
    probabilities = torch.tensor([0.1, 0.5, 0.05, 0.3, 0.05])
    assert [n for n, _ in top_predictions(probabilities, tuple("abcde"), 3)] == ["b", "d", "a"]
    top = top_predictions(probabilities, ())  # no names: class indices; at most K
    assert [n for n, _ in top][:3] == ["1", "3", "0"] and len(top) == 5
    assert top[0][1] == pytest.approx(0.5)


def test_overlay_heatmap_geometry() -> None:
    grey = Image.new("RGB", (60, 40), (128, 128, 128))
    heat = torch.tensor([[0.01, 0.01], [0.01, 0.02]])  # (g_h, g_w): the maximum bottom right
    out = overlay_heatmap(grey, heat, (32, 48))
    assert out.size == (60, 40) and out.mode == "RGB"
    pixels = np.asarray(out).astype(int)  # (40, 60, 3)
    assert (pixels[32:] == 128).all() and (pixels[:, 48:] == 128).all()  # not covered: as is
    # From its minimum to its maximum: grey as it was top left, the hue at opacity α bottom right.
    assert (pixels[0, 0] == 128).all()
    expected = np.round(
        ((1 - OVERLAY_ALPHA) * 128 / 255 + OVERLAY_ALPHA * np.asarray(OVERLAY_HUE)) * 255
    )
    assert np.abs(pixels[31, 47] - expected).max() <= 1
    colour = Image.new("RGB", (60, 40), (200, 40, 90))  # drawn in grey: the luma of the colour
    flat = np.asarray(overlay_heatmap(colour, torch.zeros(2, 2), (32, 48))).astype(int)
    assert len({tuple(p) for p in flat.reshape(-1, 3)}) == 1  # an even map: one colour
    assert flat[0, 0, 0] == flat[0, 0, 1] == flat[0, 0, 2]  # grey


def test_overlay_draws_the_patch_grid() -> None:
    black = Image.new("RGB", (48, 32), (0, 0, 0))
    pixels = np.asarray(overlay_heatmap(black, torch.zeros(2, 3), (32, 48), patch_pixels=16))
    line = round(GRID_GREY * 255)
    on_grid = np.zeros((32, 48), dtype=bool)
    on_grid[[0, 16, 31], :] = True
    on_grid[:, [0, 16, 32, 47]] = True
    assert (pixels[on_grid] == line).all() and (pixels[~on_grid] == 0).all()


def test_overlay_blocks_colour_each_patch_alone() -> None:
    grey = Image.new("RGB", (48, 32), (128, 128, 128))
    heat = torch.tensor([[0.0, 0.5, 1.0], [0.25, 0.75, 0.1]])  # (g_h, g_w) = (2, 3)
    pixels = np.asarray(overlay_heatmap(grey, heat, (32, 48), blocks=True)).astype(int)
    for row in range(2):
        for col in range(3):
            block = pixels[16 * row : 16 * row + 16, 16 * col : 16 * col + 16].reshape(-1, 3)
            assert len({tuple(p) for p in block}) == 1  # one colour per patch, no blending
    smooth = np.asarray(overlay_heatmap(grey, heat, (32, 48))).astype(int)
    assert len({tuple(p) for p in smooth[:16, :16].reshape(-1, 3)}) > 1  # bilinear: a gradient


def test_small_dim_inputs_are_drawn_stretched_and_pixelated(
    model_and_preprocessor: tuple[ViT, ImagePreprocessor], tmp_path: Path
) -> None:
    model, _ = model_and_preprocessor
    values = np.zeros((32, 32), dtype=np.uint8)
    values[8:24, 8:24] = 16  # a digit-like PNG: raw values 0–16, nearly black as stored
    Image.fromarray(values, "L").save(tmp_path / "dim.png")
    attention = collect_image_attention(
        model, ImagePreprocessor(do_resize=False), tmp_path / "dim.png"
    )
    overlays = draw_overlays(attention)  # × 7: 224 pixels, drawn pixel by pixel
    shown = np.asarray(overlays.input).astype(int)
    assert overlays.size == (224, 224)
    floor = round(GREY_FLOOR * 255)  # stretched: 16 is drawn white, 0 as the darkest grey
    assert set(np.unique(shown)) == {floor, 255}  # nearest: no interpolated greys at the edges


# -- the model's attention on one image ----------------------------------------------------------


def test_class_token_maps_equal_transformers(
    attention: ImageAttention, hf_attentions: tuple[list[torch.Tensor], torch.Tensor]
) -> None:
    expected, probabilities = hf_attentions
    assert (attention.num_layers, attention.num_heads, attention.grid) == (LAYERS, HEADS, GRID)
    assert attention.input_size == (32, 32) and attention.image.size == (40, 30)
    maps = attention.cls_maps()
    for ours, theirs, weights in zip(maps, expected, attention.weights, strict=True):
        assert weights.shape == theirs.shape == (HEADS, 17, 17)
        assert ours.shape == (HEADS, *GRID)
        torch.testing.assert_close(ours, theirs[:, 0, 1:].reshape(HEADS, 4, 4), atol=1e-4, rtol=0)
        # the patch in grid row 1, column 2 is key 1 + 1·4 + 2
        torch.testing.assert_close(ours[:, 1, 2], theirs[:, 0, 7], atol=1e-4, rtol=0)
    assert not torch.allclose(maps[0], torch.full_like(maps[0], 1 / 17), atol=1e-3)
    assert attention.probabilities is not None
    torch.testing.assert_close(attention.probabilities, probabilities, atol=1e-4, rtol=0)
    order = probabilities.argsort(descending=True).tolist()
    assert [label for label, _ in attention.predictions()] == [LABELS[i] for i in order]


def test_rollout_equals_a_direct_computation(
    attention: ImageAttention, hf_attentions: tuple[list[torch.Tensor], torch.Tensor]
) -> None:
    expected, _ = hf_attentions
    rollout = np.eye(17)
    for weights in expected:  # first layer first: R ← (½·mean + ½·I) R
        rollout = (0.5 * weights.double().numpy().mean(axis=0) + 0.5 * np.eye(17)) @ rollout
    ours = attention.rollout()
    np.testing.assert_allclose(ours.numpy(), rollout, atol=1e-4)
    np.testing.assert_allclose(ours.sum(-1).numpy(), np.ones(17), atol=1e-5)
    np.testing.assert_allclose(
        attention.rollout_map().numpy(), rollout[0, 1:].reshape(4, 4), atol=1e-4
    )


def test_collect_restores_the_mode_and_reads_unresized_images(
    vit: dict[str, Any], model_and_preprocessor: tuple[ViT, ImagePreprocessor]
) -> None:
    model, _ = model_and_preprocessor
    unresized = ImagePreprocessor(do_resize=False)  # 40×30: a 5×3 grid, a 6-row border unseen
    model.train()
    try:
        attention = collect_image_attention(model, unresized, vit["png"])
        assert model.training
    finally:
        model.eval()
    assert attention.input_size == (30, 40) and attention.grid == (3, 5)
    assert all(w.shape == (HEADS, 16, 16) for w in attention.weights)
    overlays = draw_overlays(attention)  # × 6: the longer side 240 >= 224
    assert overlays.size == (240, 180) and overlays.covered == (144, 240)
    head = np.asarray(overlays.heads[0][0])
    assert head.shape == (180, 240, 3)
    np.testing.assert_array_equal(head[144:], np.asarray(overlays.input)[144:])  # unseen border
    assert not np.array_equal(head[:144], np.asarray(overlays.input)[:144])


# -- the files, the page and the command ---------------------------------------------------------


def _page_json(page: str) -> dict[str, Any]:
    blob = re.search(
        r'<script type="application/json" id="image-attention-data">(.*?)</script>', page, re.S
    )
    assert blob is not None
    data: dict[str, Any] = json.loads(blob.group(1))
    return data


def test_cli_writes_the_overlays_and_the_page(
    vit: dict[str, Any],
    attention: ImageAttention,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "maps"
    argv = ["attention", "--checkpoint", str(vit["ckpt"]), "--image", str(vit["png"])]
    assert main([*argv, "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "read as 32×32 pixels: a 4×4 grid of 8×8 patches" in stdout
    assert "wrote 12 PNG files" in stdout
    names = {p.name for p in out.iterdir()}
    assert len(names) == 1 + LAYERS * HEADS + LAYERS + 1 + 2
    assert names == {*image_attention_pngs(attention), "attention.html", "head_view.html"}
    assert {"input.png", "cls_L1_H1.png", "cls_L2_H4.png", "cls_L2_all.png", "rollout.png"} <= names
    head_view = (out / "head_view.html").read_text(encoding="utf-8")  # [CLS], then the patches
    blob = re.search(r'id="attention-data">(.*?)</script>', head_view, re.S)
    assert blob is not None
    view = json.loads(blob.group(1))["kinds"][0]
    assert view["rows"][:3] == ["[CLS]", "r1c1", "r1c2"] and len(view["rows"]) == 1 + 16
    weights = np.stack([w.numpy() for w in attention.weights])  # (L, n, T, T)
    np.testing.assert_allclose(np.array(view["layers"]), weights, atol=1e-4)
    bar_top = np.round(((1 - OVERLAY_ALPHA) + OVERLAY_ALPHA * np.asarray(OVERLAY_HUE)) * 255)
    for name in sorted(names - {"attention.html", "head_view.html"}):
        with Image.open(out / name) as image:
            image.load()
            assert image.format == "PNG"
            pixels = np.asarray(image.convert("RGB")).reshape(-1, 3).astype(int)
        # a figure: the 224-pixel drawing with a title, numbered axes and (maps) a colour bar
        assert image.width > 224 and image.height > 224
        reddish = (pixels[:, 0] > pixels[:, 1] + 60) & (pixels[:, 0] > pixels[:, 2] + 60)
        assert reddish.any() != (name == "input.png"), name  # the hue on every map, not the input
        if name != "input.png":  # the colour bar's top: the hue at its opacity over white
            assert np.abs(pixels - bar_top).max(axis=1).min() <= 3, name
    with Image.open(out / "cls_L2_all.png") as sheet:  # 4 heads side by side
        assert sheet.width > 3 * sheet.height

    page = (out / "attention.html").read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page
    markup = re.sub(r"<script\b[^>]*>.*?</script>", "", page, flags=re.S)  # the tags only
    sources = re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]*)""", markup)
    assert sources and all(s.startswith("data:image/") for s in sources)
    data = _page_json(page)
    top = attention.predictions()
    assert [p["label"] for p in data["predictions"]] == [label for label, _ in top]
    for label, probability in top:
        assert f"<td>{label}</td>" in page and f"{probability:.4f}" in page
    assert len(data["layers"]) == LAYERS and all(len(heads) == HEADS for heads in data["layers"])
    for uri in [data["input"], data["rollout"], *data["layers"][0]]:
        encoded = uri.split(",", 1)[1]
        with Image.open(io.BytesIO(base64.b64decode(encoded))) as image:
            assert image.size == (224, 224)
    np.testing.assert_allclose(np.array(data["maps"]), np.stack(attention.cls_maps()), atol=1e-5)
    np.testing.assert_allclose(np.array(data["rollout_map"]), attention.rollout_map(), atol=1e-5)


def test_cli_no_png_writes_only_the_page(vit: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "maps"
    argv = ["attention", "--checkpoint", str(vit["ckpt"]), "--image", str(vit["png"])]
    assert main([*argv, "--out", str(out), "--no-png"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["attention.html", "head_view.html"]


def test_page_escapes_labels_and_handles_no_classifier(attention: ImageAttention) -> None:
    nasty = ImageAttention(
        name="<b>x</b>.png",
        image=attention.image,
        input_size=attention.input_size,
        patch_size=attention.patch_size,
        grid=attention.grid,
        weights=attention.weights,
        probabilities=torch.tensor([0.2, 0.7, 0.1]),
        label_names=("cat", "</script><script>alert(1)</script>", "fox"),
    )
    page = image_attention_html(nasty)
    assert page.count("</script>") == 2 and "alert(1)</script>" not in page
    assert "&lt;b&gt;x&lt;/b&gt;.png" in page
    assert _page_json(page)["predictions"][0]["label"] == "</script><script>alert(1)</script>"
    plain = dataclasses.replace(nasty, probabilities=None, label_names=())
    assert plain.predictions() == []
    assert "no classifier" in image_attention_html(plain)
    assert page_data(plain, draw_overlays(plain))["predictions"] == []


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn attention: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_cli_refusals(
    vit: dict[str, Any],
    checkpoint_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ckpt, png, out = str(vit["ckpt"]), str(vit["png"]), str(tmp_path / "out")
    base = ["attention", "--out", out, "--checkpoint"]
    err = _fails([*base, str(checkpoint_dir), "--image", png], capsys)
    assert "--image is for ViT checkpoints" in err and "transformer" in err
    err = _fails([*base, ckpt, "--src", "the cat sat"], capsys)
    assert "--src is for Transformer or T5 checkpoints" in err and "give --image" in err
    assert "--tgt" in _fails([*base, ckpt, "--image", png, "--tgt", "die katze"], capsys)
    assert "give --image" in _fails([*base, ckpt], capsys)
    assert "give --src" in _fails([*base, str(checkpoint_dir)], capsys)
    text = tmp_path / "not_an_image.png"
    text.write_text("hello", encoding="utf-8")
    assert f"{text}: cannot read the image" in _fails([*base, ckpt, "--image", str(text)], capsys)
    missing = tmp_path / "missing.png"
    assert f"{missing}: cannot read" in _fails([*base, ckpt, "--image", str(missing)], capsys)
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_info:  # argparse: the two inputs exclude each other
        main([*base, ckpt, "--image", png, "--src", "a cat"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


# -- the page in a headless browser (skipped without Chromium and Selenium) ---------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed")
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("chromium and chromedriver are not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="aiayn-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(15)
    try:
        driver.execute_cdp_cmd(
            "Page.addScriptToEvaluateOnNewDocument",
            {"source": "window.__errors = []; window.addEventListener('error', "
             "function (e) { window.__errors.push(String(e.message)); });"},
        )  # fmt: skip
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_page_in_headless_chromium(browser: Any, attention: ImageAttention, tmp_path: Path) -> None:
    page = tmp_path / "attention.html"
    page.write_text(image_attention_html(attention), encoding="utf-8")
    browser.get(page.as_uri())
    api = "return window.aiaynImageAttention"
    assert browser.execute_script("return window.__errors;") == []
    assert browser.execute_script(f"{api}.state();") == {"layer": LAYERS, "head": 1}
    first = browser.execute_script(f"{api}.source();")
    browser.execute_script("window.aiaynImageAttention.select(1, 3);")
    assert browser.execute_script(f"{api}.state();") == {"layer": 1, "head": 3}
    assert browser.execute_script(f"{api}.source();") != first
    matrix = browser.execute_script(f"{api}.matrix();")
    np.testing.assert_allclose(np.array(matrix), attention.cls_maps()[0][2], atol=1e-5)
    from selenium.webdriver.support.ui import WebDriverWait

    widths = (
        "return ['input', 'overlay', 'rollout'].map(function (id) {"
        "  return document.getElementById(id).naturalWidth; });"
    )
    WebDriverWait(browser, 10).until(lambda d: d.execute_script(widths) == [224, 224, 224])
    assert browser.execute_script("return window.__errors;") == []
