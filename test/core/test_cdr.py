import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosmos_reason_ros.core.cdr import parse_image
from cosmos_reason_ros.core.types import BadImageError

serialization = pytest.importorskip("rclpy.serialization", reason="needs the ROS 2 wheels")
from sensor_msgs.msg import Image  # noqa: E402


@settings(max_examples=200, deadline=None, derandomize=True)
@given(frame_id=st.text(max_size=9), encoding=st.sampled_from(["rgb8", "mono16", "bgra8", ""]),
       height=st.integers(0, 5), width=st.integers(0, 7), bigendian=st.integers(0, 1),
       step=st.integers(0, 40), data=st.binary(max_size=67), sec=st.integers(-2**31, 2**31 - 1),
       nanosec=st.integers(0, 2**32 - 1))
def test_fields_equal_rclpy_deserialization(frame_id, encoding, height, width, bigendian,
                                            step, data, sec, nanosec):
    msg = Image(height=height, width=width, encoding=encoding, is_bigendian=bigendian,
                step=step, data=data)
    msg.header.frame_id = frame_id.replace("\0", "")
    msg.header.stamp.sec, msg.header.stamp.nanosec = sec, nanosec
    raw = serialization.serialize_message(msg)
    fields = parse_image(raw)
    back = serialization.deserialize_message(raw, Image)
    assert (fields.sec, fields.nanosec, fields.frame_id) == (
        back.header.stamp.sec, back.header.stamp.nanosec, back.header.frame_id)
    assert (fields.height, fields.width, fields.encoding, fields.is_bigendian, fields.step) == (
        back.height, back.width, back.encoding, back.is_bigendian, back.step)
    assert bytes(fields.data) == bytes(back.data)


def test_pixels_are_a_view_not_a_copy():
    raw = serialization.serialize_message(Image(height=1, width=2, encoding="mono8", step=2,
                                                data=b"\x01\x02"))
    assert parse_image(raw).data.obj is raw


@pytest.mark.parametrize("cut", [0, 3, 10, 30])
def test_truncated_or_foreign_bytes_are_bad_images(cut):
    raw = serialization.serialize_message(Image(height=2, width=2, encoding="mono8", step=2,
                                                data=b"\x00" * 4))
    with pytest.raises(BadImageError):
        parse_image(raw[:cut] if cut else b"\x07\x07\x07\x07")
