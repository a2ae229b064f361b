"""The demo recording's depth stream and 3D ground truth agree with its colour and CameraInfo."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("rosbags", reason="needs rosbags (make setup)")
from cosmos_reason_ros.core.cdr import read_stored_frame  # noqa: E402
from cosmos_reason_ros.core.rgbd import check_registration, depth_image  # noqa: E402
from cosmos_reason_ros.eval import bagio  # noqa: E402
from cosmos_reason_ros.eval import demo_recording as dr  # noqa: E402

PARAMS = dr.RecordingParams(width=320, height=240, duration_s=0.2, storage="mcap")


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    return dr.write_recording(tmp_path_factory.mktemp("rec") / "bag", PARAMS)


def by_topic(bag):
    store = bagio.typestore()
    out: dict[str, list] = {}
    for topic, msgtype, t, data in bagio.messages(bag, list(bagio.bag_info(bag).topics)):
        msg = store.deserialize_cdr(data, msgtype) if topic != dr.DEPTH_TOPIC else None
        out.setdefault(topic, []).append((t, data, msg))
    return out


def test_depth_is_registered_to_the_colour_image(bag):
    info = bagio.bag_info(bag)
    assert info.topics[dr.DEPTH_TOPIC] == bagio.IMAGE_TYPE
    msgs = by_topic(bag)
    colour = [bagio.header_stamp_ns(m) for _t, _d, m in msgs[dr.IMAGE_TOPIC]]
    assert len(colour) == PARAMS.frames == 4
    camera = dr.camera_model(PARAMS)
    for (t, data, _), stamp in zip(msgs[dr.DEPTH_TOPIC], colour, strict=True):
        depth = read_stored_frame((False, data))
        assert depth.stamp_ns == stamp == t  # same stamps, recorded at once
        assert (depth.encoding, depth.width, depth.height) == ("16UC1", 320, 240)
        assert depth.frame_id == dr.FRAME_ID
        assert check_registration((320, 240), (depth.width, depth.height), dr.FRAME_ID,
                                  depth.frame_id, "", camera) == 1
    # The colour and depth topics are told apart by encoding.
    assert bagio.pick_image_topic(info) == dr.IMAGE_TOPIC
    assert bagio.pick_depth_topics(info) == (dr.DEPTH_TOPIC, dr.CAMERA_INFO_TOPIC)


def test_depth_renders_the_3d_layout_that_projects_onto_the_drawn_boxes(bag):
    msgs = by_topic(bag)
    camera = dr.camera_model(PARAMS)
    cam_msg = msgs[dr.CAMERA_INFO_TOPIC][0][2]
    assert list(cam_msg.k) == pytest.approx([camera.fx, 0, camera.cx, 0, camera.fy, camera.cy,
                                             0, 0, 1])
    _t, data, _ = msgs[dr.DEPTH_TOPIC][0]
    d = read_stored_frame((False, data))
    z = depth_image(d.encoding, d.width, d.height, d.step, d.data, d.is_bigendian).metres()
    gt = json.loads(msgs[dr.GROUND_TRUTH_TOPIC][0][2].data)
    assert gt["frame_id"] == dr.FRAME_ID
    scene = dr.render_frame(0.0, 320, 240)
    missing = z == 0
    assert 0.005 < missing.mean() < 0.02  # ~1 % of pixels without a return
    exact = dr.render_depth(scene, camera)
    rel = np.abs(z[~missing] / exact[~missing] - 1)
    assert rel.std() < 0.003 and np.median(rel) < 0.002  # 0.2 % noise, millimetre steps
    wall = dr.wall_depth_m(camera)
    assert 3.0 < wall < 4.0 and exact[0, 0] == pytest.approx(wall)
    for o in gt["objects"]:
        label, (x0, y0, x1, y1) = o["label"], o["box"]
        assert set(o) == {"label", "box", "center_3d", "size_3d"}  # "box" kept as it was
        (cx, cy, cz), (w, h, dz) = o["center_3d"], o["size_3d"]
        # The face projects exactly onto the drawn box (continuous pixels [x0, x1 + 1)) ...
        u0, v0 = camera.project(cx - w / 2, cy - h / 2, cz)
        u1, v1 = camera.project(cx + w / 2, cy + h / 2, cz)
        assert (u0, v0, u1, v1) == pytest.approx((x0, y0, x1 + 1, y1 + 1), abs=1e-3)  # 1 um
        # ... its lower edge stands on the table, and the cuboid's footprint is square.
        assert cy + h / 2 == pytest.approx(dr.CAMERA_HEIGHT_M, abs=1e-5)
        assert dz == pytest.approx(w)
        assert 0.9 < cz < 1.3 and 0.1 < w < 0.25
        # Depth on the object's drawn pixels is its face; the table below it is farther.
        ids = scene.ids == 1 + [n for n, *_ in dr.OBJECTS].index(label)
        assert ids.sum() > 300 and np.allclose(exact[ids], cz, rtol=0, atol=1e-5)
        below = exact[min(y1 + 3, 239), (x0 + x1) // 2]
        assert below == pytest.approx(camera.fy * dr.CAMERA_HEIGHT_M
                                      / (min(y1 + 3, 239) - camera.cy)) and below < cz


def test_foreign_formats_and_determinism(tmp_path, bag):
    half = dr.write_recording(tmp_path / "half", dr.RecordingParams(
        width=320, height=240, duration_s=0.1, depth_encoding="32FC1", depth_divisor=2,
        depth_frame_id="other", depth_delay_s=0.25))
    msgs = by_topic(half)
    t, data, _ = msgs[dr.DEPTH_TOPIC][0]
    d = read_stored_frame((False, data))
    assert (d.encoding, d.width, d.height, d.frame_id) == ("32FC1", 160, 120, "other")
    assert t - d.stamp_ns == 250_000_000  # delivered late
    z = depth_image(d.encoding, d.width, d.height, d.step, d.data).metres()
    assert 0.005 < np.isnan(z).mean() < 0.02  # missing returns are NaN in 32FC1
    # Same parameters, same bytes (cached recordings are reused on that promise).
    again = dr.write_recording(tmp_path / "again", PARAMS)
    assert [m[1] for m in by_topic(again)[dr.DEPTH_TOPIC]] == \
        [m[1] for m in by_topic(bag)[dr.DEPTH_TOPIC]]


@pytest.mark.parametrize(("field", "value", "match"), [
    ("depth_encoding", "mono16", "depth_encoding='mono16': allowed 16UC1, 32FC1"),
    ("depth_divisor", 3, "depth_divisor=3: must divide the size 320x240"),
    ("depth_delay_s", -1.0, "depth_delay_s=-1.0: allowed 0 to 10"),
])
def test_bad_depth_parameters_are_refused(field, value, match):
    with pytest.raises(ValueError, match=match):
        dr.RecordingParams(width=320, height=240, **{field: value}).validate()


def test_the_command_line_writes_foreign_depth(tmp_path, capsys):
    assert dr.main([str(tmp_path / "b"), "--size", "64x48", "--duration", "0.1",
                    "--depth-encoding", "32FC1", "--depth-divisor", "2"]) == 0
    assert dr.DEPTH_TOPIC in capsys.readouterr().out
    d = read_stored_frame((False, next(bagio.messages(tmp_path / "b", [dr.DEPTH_TOPIC]))[3]))
    assert (d.encoding, d.width) == ("32FC1", 32)
    assert dr.main([str(tmp_path / "c"), "--size", "64x48", "--duration", "0.1",
                    "--no-depth"]) == 0
    assert dr.DEPTH_TOPIC not in bagio.bag_info(tmp_path / "c").topics
