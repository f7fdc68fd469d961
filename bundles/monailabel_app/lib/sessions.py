"""MONAI Label sessions with a capped life (docs/monailabel.md, "Serving safely").

A session holds an uploaded image in MONAI Label's session folder until it expires. MONAI Label 0.8.5 counts the
expiry from the last access, so a client that keeps using a session keeps its files forever; a session whose
``meta.info`` holds no expiry (``0``) never expires; and one broken session folder (its image removed) stops the
clean-up job with an exception. :class:`CappedSessions`:

- a request's ``expiry`` must be ``0`` (the server's default) or a number of seconds >= 1; larger values are cut to
  the server's maximum, ``MONAI_LABEL_SESSION_EXPIRY`` (:func:`check_expiry`, HTTP 422 for anything else);
- a session ends ``expiry`` seconds after its last access and in any case :data:`MAX_SESSION_LIFETIME` seconds after
  it was created, whatever its ``meta.info`` says;
- a session folder that cannot be read is removed instead of stopping the clean-up;
- only folders this app created are ever read, served or removed: each new session folder gets a marker file,
  :data:`SESSION_MARKER`, and a folder of the session path without it (the studies folder or a user's files when
  ``MONAI_LABEL_SESSION_PATH`` is a folder that holds other things, a session of an earlier version) is left as it
  is: no clean-up removes it, ``GET`` / ``DELETE /session/<name>`` answer 404 for it, and no new session is written
  into it. Each removal is logged with the session and the reason.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from typing import Any

from fastapi import HTTPException

from monailabel.utils.sessions import Sessions

__all__ = ["MAX_SESSION_LIFETIME", "SESSION_MARKER", "CappedSessions", "check_expiry"]

logger = logging.getLogger(__name__)

#: the longest a session lives, in seconds from its creation, however often it is used (one day)
MAX_SESSION_LIFETIME = 24 * 3600
#: the file that marks a session folder as created by this app; folders without it are never read or removed
SESSION_MARKER = ".spectraflow_session"


def check_expiry(value: Any, maximum: int) -> int:
    """The expiry of a new session: ``0`` (the server's default) or seconds >= 1, cut to ``maximum``.

    Args:
        value: the request's ``expiry``.
        maximum: the server's maximum (``MONAI_LABEL_SESSION_EXPIRY``).

    Raises:
        HTTPException: 422 for a negative value or one that is not an integer.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HTTPException(
            status_code=422,
            detail=f"expiry must be 0 (the server's default) or a number of seconds >= 1 (at most {maximum} are used)",
        )
    return min(value, maximum) if value > 0 else 0


class CappedSessions(Sessions):
    """MONAI Label's ``Sessions`` with a capped life (see the module docstring).

    Args:
        store_path: the session folder (``MONAI_LABEL_SESSION_PATH``; empty: MONAI Label's default).
        expiry: the default and largest expiry in seconds (``MONAI_LABEL_SESSION_EXPIRY``; at most
            :data:`MAX_SESSION_LIFETIME`).
        lifetime: seconds a session lives at most from its creation. Default :data:`MAX_SESSION_LIFETIME`.
    """

    def __init__(self, store_path: str = "", expiry: int = 3600, lifetime: int = MAX_SESSION_LIFETIME):
        super().__init__(store_path, expiry)
        self.lifetime = int(lifetime)
        self.expiry = min(self.expiry, self.lifetime)

    def _marked(self, session_id: Any) -> bool:
        """Whether ``<store_path>/<session_id>`` is a session folder this app created (it holds the marker)."""
        if not isinstance(session_id, str) or not session_id or os.sep in session_id or session_id in (".", ".."):
            return False
        folder = os.path.join(self.store_path, session_id)
        return not os.path.islink(folder) and os.path.isfile(os.path.join(folder, SESSION_MARKER))

    def add_session(self, data_file: str, expiry: int = 0, uncompress: bool = False, session_id: Any = None):
        expiry = check_expiry(expiry, self.expiry)
        session_id = session_id or str(uuid.uuid1()).lower()
        folder = os.path.join(self.store_path, session_id)
        if not self._marked(session_id):
            if os.path.lexists(folder):  # a folder of the session path that is not a session of this app
                raise HTTPException(status_code=409, detail="this session id is taken; leave session_id out")
            os.makedirs(folder)
            with open(os.path.join(folder, SESSION_MARKER), "w") as marker:
                marker.write("a MONAI Label session folder of the SpectraFlow app; removed when the session ends\n")
        return super().add_session(data_file, expiry, uncompress, session_id)

    def get_session(self, session_id: str, update_ts: bool = True, fetch_cache: bool = True) -> Any:
        """MONAI Label's ``get_session`` for the folders this app created; ``None`` for any other name."""
        if not self._marked(session_id):
            self.pop(session_id, None)
            return None
        return super().get_session(session_id, update_ts, fetch_cache)

    def remove_session(self, session_id: str) -> None:
        """Remove the session folder ``session_id`` if this app created it; any other folder is left as it is."""
        self.pop(session_id, None)
        if not self._marked(session_id):
            logger.info(f"session {session_id!r}: not a session folder of this app (no {SESSION_MARKER}), left as is")
            return
        shutil.rmtree(os.path.join(self.store_path, session_id), ignore_errors=True)

    def _expired(self, info: Any, now: int) -> bool:
        expiry = min(int(info.expiry or 0) or self.expiry, self.expiry)
        created = int(info.create_ts or 0)
        last = max(int(info.last_access_ts or 0), created)
        return last + expiry < now or created + self.lifetime < now

    def remove_expired(self) -> int:
        """Remove the sessions of this app that expired, outlived :attr:`lifetime` or cannot be read, each logged;
        folders without :data:`SESSION_MARKER` are never touched. Returns how many were removed."""
        count = 0
        now = int(time.time())
        if not os.path.isdir(self.store_path):
            return count
        for session_id in sorted(os.listdir(self.store_path)):
            if not self._marked(session_id):
                continue
            folder = os.path.join(self.store_path, session_id)
            try:
                info = self.get_session(session_id, update_ts=False, fetch_cache=False)
                # (a marked folder without meta.info for a minute is one being created, not a broken one)
                if info:
                    reason = "expired" if self._expired(info, now) else ""
                else:
                    reason = "no session record" if os.path.getmtime(folder) < now - 60 else ""
            except Exception as e:  # a broken meta.info: the session cannot be served
                reason = f"unreadable ({type(e).__name__})"
            if reason:
                self.remove_session(session_id)
                logger.info(f"session {session_id}: {reason}, removed")
                count += 1
        return count
