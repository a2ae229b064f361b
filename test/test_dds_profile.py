"""The node's Fast DDS writer profile: used only when nothing else configures Fast DDS."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from cosmos_reason_ros.ros import dds


def test_the_profile_is_named_when_nothing_else_configures_fast_dds(tmp_path):
    env: dict[str, str] = {}
    line = dds.use_writer_profile(env, cwd=tmp_path)
    assert env == {"FASTDDS_DEFAULT_PROFILES_FILE": str(dds.WRITER_PROFILE),
                   "FASTRTPS_DEFAULT_PROFILES_FILE": str(dds.WRITER_PROFILE)}
    assert "100 ms" in line and "FASTDDS_DEFAULT_PROFILES_FILE" in line
    env = {"RMW_IMPLEMENTATION": "rmw_fastrtps_dynamic_cpp"}
    dds.use_writer_profile(env, cwd=tmp_path)
    assert env["FASTDDS_DEFAULT_PROFILES_FILE"] == str(dds.WRITER_PROFILE)


@pytest.mark.parametrize("env, says", [
    ({"FASTDDS_DEFAULT_PROFILES_FILE": "/etc/mine.xml"}, "/etc/mine.xml (the user's)"),
    ({"FASTRTPS_DEFAULT_PROFILES_FILE": "/etc/old.xml"}, "/etc/old.xml (the user's)"),
    ({"RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}, "RMW_IMPLEMENTATION=rmw_cyclonedds_cpp"),
    ({"RMW_IMPLEMENTATION": "rmw_zenoh_cpp"}, "RMW_IMPLEMENTATION=rmw_zenoh_cpp"),
    ({"RMW_FASTRTPS_USE_QOS_FROM_XML": "1"}, "RMW_FASTRTPS_USE_QOS_FROM_XML"),
])
def test_the_users_own_configuration_is_left_alone(tmp_path, env, says):
    before = dict(env)
    assert says in dds.use_writer_profile(env, cwd=tmp_path)
    assert env == before


@pytest.mark.parametrize("name", ["DEFAULT_FASTDDS_PROFILES.xml", "DEFAULT_FASTRTPS_PROFILES.xml"])
def test_a_profile_in_the_working_directory_is_left_alone(tmp_path, name):
    (tmp_path / name).write_text("<dds/>")
    env: dict[str, str] = {}
    assert "(the user's)" in dds.use_writer_profile(env, cwd=tmp_path)
    assert env == {}


def test_the_profile_sets_a_100_ms_heartbeat_for_every_writer():
    ns = {"d": "http://www.eprosima.com"}
    writer = ET.parse(dds.WRITER_PROFILE).getroot().find("d:profiles/d:data_writer", ns)
    assert writer.get("is_default_profile") == "true"
    period = writer.find("d:times/d:heartbeat_period", ns)
    assert (period.findtext("d:sec", namespaces=ns), period.findtext("d:nanosec", namespaces=ns)) \
        == ("0", "100000000")
