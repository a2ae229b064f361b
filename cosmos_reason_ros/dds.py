"""Our processes' Fast DDS profile: lost samples repaired in ~0.1 s, a frozen node not dropped.

- Writers: on a loaded machine a sample of the node's goal results went missing between
  processes on one host and reached the client only at the writer's next heartbeat, Fast DDS's
  default every 3 s: 5 of 24 results 3.02 s late on a 2-core machine, idle or not
  (docs/RELIABILITY.md, "Late results: DDS repair"). Replay's frames waited as long for the
  node's acknowledgement. The profile's writers announce unacknowledged samples every 100 ms.
- Participant lease: a node process held for 25-30 s (SIGSTOP, or an overloaded machine
  freezing it; CI machines froze processes for 19-103 s) was dropped by its clients at Fast
  DDS's default 20 s lease, and the requests they had sent it meanwhile went with it: not one
  of the cancels sent during the hold reached the node, and every goal ran its whole answer.
  The node announces a 300 s lease, so a held node keeps its clients and their requests; a
  node that crashed stays listed for up to that long (a client's goal to it is reported not
  delivered; docs/RELIABILITY.md, "Machine freezes").

Fast DDS takes these settings only from XML profiles, so the node and replay point Fast DDS at
the package's profile, unless the user chose Fast DDS XML of their own or another RMW. A
library client (``ReasonClient``) leaves the user's process as it is.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

# Fast DDS 3 (Kilted) and 2.x (Jazzy, Humble) name the XML elements differently and reject
# the other's: one file each.
PROFILES = {3: Path(__file__).with_name("fastdds3_profile.xml"),
            2: Path(__file__).with_name("fastdds2_profile.xml")}
# Fast DDS 3's library and 2.x's (the name changed with the major version).
_LIBRARIES = {3: "libfastdds.so.3", 2: "libfastrtps.so.2"}
PROFILE_ENV = "FASTDDS_DEFAULT_PROFILES_FILE"
# Humble's Fast DDS (2.6) reads the older name.
PROFILE_ENVS = (PROFILE_ENV, "FASTRTPS_DEFAULT_PROFILES_FILE")
# Fast DDS loads these from the working directory when no profile file is named.
_CWD_PROFILES = ("DEFAULT_FASTDDS_PROFILES.xml", "DEFAULT_FASTRTPS_PROFILES.xml")


def use_profile(environ: MutableMapping[str, str] = os.environ,
                       cwd: Path | None = None) -> str:
    """Name the package's profile in ``environ`` when nothing else configures Fast DDS.

    Call before the process's first ROS node (Fast DDS reads its profiles once). Returns a
    line for the log saying what was decided and why.
    """
    rmw = environ.get("RMW_IMPLEMENTATION", "") or "rmw_fastrtps_cpp"
    if not rmw.startswith("rmw_fastrtps"):
        return f"Fast DDS profile not used: RMW_IMPLEMENTATION={rmw}"
    for name in PROFILE_ENVS:
        if environ.get(name):
            return f"Fast DDS profiles from {name}={environ[name]} (the user's)"
    if environ.get("RMW_FASTRTPS_USE_QOS_FROM_XML", "0") not in ("", "0"):
        return "Fast DDS profile not used: RMW_FASTRTPS_USE_QOS_FROM_XML is set"
    major = fast_dds_major(environ)
    if major is None:
        return ("Fast DDS profile not used: neither libfastdds.so.3 nor libfastrtps.so.2 "
                "found under AMENT_PREFIX_PATH or LD_LIBRARY_PATH")
    here = cwd or Path.cwd()
    own = [name for name in _CWD_PROFILES if (here / name).is_file()]
    if own:
        return f"Fast DDS profiles from {here / own[0]} (the user's)"
    # Kilted's RMW warns that the older name is deprecated: named for Fast DDS 2.x alone.
    for name in PROFILE_ENVS if major == 2 else (PROFILE_ENV,):
        environ[name] = str(PROFILES[major])
    return (f"Fast DDS writers repair lost samples after 100 ms and the participant lease is "
            f"300 s ({PROFILES[major]}); "
            f"set {PROFILE_ENV} to use a profile of your own")


def fast_dds_major(environ: MutableMapping[str, str] = os.environ) -> int | None:
    """Fast DDS's major version (3 or 2) by the library ROS finds, None if none is found.

    Read from the file names, not by loading it: Fast DDS reads its profiles when it loads.
    """
    dirs = [Path(p) / "lib" for p in environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    dirs += [Path(p) for p in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    for major, library in _LIBRARIES.items():
        if any(next(d.glob(library + "*"), None) for d in dirs if d.is_dir()):
            return major
    return None
