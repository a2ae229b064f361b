"""The node's Fast DDS profile: used only when nothing else configures Fast DDS."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from cosmos_reason_ros import dds


def fast_dds(tmp_path, library: str) -> dict[str, str]:
    """An environment whose AMENT_PREFIX_PATH holds ``library`` (an empty stand-in file)."""
    (tmp_path / "prefix" / "lib").mkdir(parents=True)
    (tmp_path / "prefix" / "lib" / library).write_text("")
    return {"AMENT_PREFIX_PATH": str(tmp_path / "prefix")}


def test_fast_dds_3_gets_its_profile_under_the_current_name(tmp_path):
    env = fast_dds(tmp_path, "libfastdds.so.3.2.2")
    line = dds.use_profile(env, cwd=tmp_path)
    profile = str(dds.PROFILES[3])
    assert env["FASTDDS_DEFAULT_PROFILES_FILE"] == profile
    assert "FASTRTPS_DEFAULT_PROFILES_FILE" not in env  # deprecated there: Kilted warns
    assert "100 ms" in line and profile in line
    env = {**fast_dds(tmp_path / "b", "libfastdds.so.3"),
           "RMW_IMPLEMENTATION": "rmw_fastrtps_dynamic_cpp"}
    dds.use_profile(env, cwd=tmp_path)
    assert env["FASTDDS_DEFAULT_PROFILES_FILE"] == profile


def test_fast_dds_2_gets_its_profile_under_both_names(tmp_path):
    env = fast_dds(tmp_path, "libfastrtps.so.2.14.5")
    dds.use_profile(env, cwd=tmp_path)
    profile = str(dds.PROFILES[2])
    assert env["FASTDDS_DEFAULT_PROFILES_FILE"] == env["FASTRTPS_DEFAULT_PROFILES_FILE"] == profile


def test_no_fast_dds_library_found_names_no_profile(tmp_path):
    env = {"AMENT_PREFIX_PATH": str(tmp_path), "LD_LIBRARY_PATH": str(tmp_path)}
    assert "not used" in dds.use_profile(env, cwd=tmp_path)
    assert "FASTDDS_DEFAULT_PROFILES_FILE" not in env


@pytest.mark.parametrize("env, says", [
    ({"FASTDDS_DEFAULT_PROFILES_FILE": "/etc/mine.xml"}, "/etc/mine.xml (the user's)"),
    ({"FASTRTPS_DEFAULT_PROFILES_FILE": "/etc/old.xml"}, "/etc/old.xml (the user's)"),
    ({"RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}, "RMW_IMPLEMENTATION=rmw_cyclonedds_cpp"),
    ({"RMW_IMPLEMENTATION": "rmw_zenoh_cpp"}, "RMW_IMPLEMENTATION=rmw_zenoh_cpp"),
    ({"RMW_FASTRTPS_USE_QOS_FROM_XML": "1"}, "RMW_FASTRTPS_USE_QOS_FROM_XML"),
])
def test_the_users_own_configuration_is_left_alone(tmp_path, env, says):
    before = dict(env)
    assert says in dds.use_profile(env, cwd=tmp_path)
    assert env == before


@pytest.mark.parametrize("name", ["DEFAULT_FASTDDS_PROFILES.xml", "DEFAULT_FASTRTPS_PROFILES.xml"])
def test_a_profile_in_the_working_directory_is_left_alone(tmp_path, name):
    (tmp_path / name).write_text("<dds/>")
    env = fast_dds(tmp_path, "libfastdds.so.3")
    before = dict(env)
    assert "(the user's)" in dds.use_profile(env, cwd=tmp_path)
    assert env == before


@pytest.mark.parametrize("major, element", [(3, "heartbeat_period"), (2, "heartbeatPeriod")])
def test_each_profile_sets_a_100_ms_heartbeat_for_every_writer(major, element):
    ns = {"d": "http://www.eprosima.com"}
    root = ET.parse(dds.PROFILES[major]).getroot()
    writer = root.find("d:profiles/d:data_writer", ns)
    assert writer.get("is_default_profile") == "true"
    period = writer.find(f"d:times/d:{element}", ns)
    assert (period.findtext("d:sec", namespaces=ns), period.findtext("d:nanosec", namespaces=ns)) \
        == ("0", "100000000")


@pytest.mark.parametrize("major", [3, 2])
def test_each_profile_announces_a_participant_lease_longer_than_a_machine_freeze(major):
    # A node held longer than its clients' view of its lease lost them for good (dds.py).
    ns = {"d": "http://www.eprosima.com"}
    root = ET.parse(dds.PROFILES[major]).getroot()
    participant = root.find("d:profiles/d:participant", ns)
    assert participant.get("is_default_profile") == "true"
    lease = participant.find("d:rtps/d:builtin/d:discovery_config/d:leaseDuration", ns)
    assert int(lease.findtext("d:sec", namespaces=ns)) >= 300
