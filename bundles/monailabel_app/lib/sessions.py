"""MONAI Label sessions with a capped life (docs/monailabel.md, "Serving safely").

A session holds an uploaded image in MONAI Label's session folder until it expires. MONAI Label 0.8.5 counts the
expiry from the last access, so a client that keeps using a session keeps its files forever; a session whose
``meta.info`` holds no expiry (``0``) never expires; and one broken session folder (its image removed) stops the
clean-up job with an exception. :class:`CappedSessions`:

- a request's ``expiry`` must be ``0`` (the server's default) or a number of seconds >= 1; larger values are cut to
  the server's maximum, ``MONAI_LABEL_SESSION_EXPIRY`` (:func:`check_expiry`, HTTP 422 for anything else);
- a session ends ``expiry`` seconds after its last access and in any case :data:`MAX_SESSION_LIFETIME` seconds after
  it was created, whatever its ``meta.info`` says;
- a session folder that cannot be read is removed instead of stopping the clean-up.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any

from fastapi import HTTPException

from monailabel.utils.sessions import Sessions

__all__ = ["MAX_SESSION_LIFETIME", "CappedSessions", "check_expiry"]

logger = logging.getLogger(__name__)

#: the longest a session lives, in seconds from its creation, however often it is used (one day)
MAX_SESSION_LIFETIME = 24 * 3600


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

    def add_session(self, data_file: str, expiry: int = 0, uncompress: bool = False, session_id: Any = None):
        expiry = check_expiry(expiry, self.expiry)
        return super().add_session(data_file, expiry, uncompress, session_id)

    def _expired(self, info: Any, now: int) -> bool:
        expiry = min(int(info.expiry or 0) or self.expiry, self.expiry)
        created = int(info.create_ts or 0)
        last = max(int(info.last_access_ts or 0), created)
        return last + expiry < now or created + self.lifetime < now

    def remove_expired(self) -> int:
        """Remove the sessions that expired, outlived :attr:`lifetime` or cannot be read; returns how many."""
        count = 0
        now = int(time.time())
        if not os.path.isdir(self.store_path):
            return count
        for session_id in os.listdir(self.store_path):
            folder = os.path.join(self.store_path, session_id)
            if not os.path.isdir(folder):
                continue
            try:
                info = self.get_session(session_id, update_ts=False, fetch_cache=False)
                # (a folder without meta.info for a minute is one being created, not a broken one)
                expired = self._expired(info, now) if info else os.path.getmtime(folder) < now - 60
            except Exception as e:  # a broken meta.info: the session cannot be served
                logger.info(f"session {session_id}: unreadable ({type(e).__name__}), removed")
                expired = True
            if expired:
                self.pop(session_id, None)
                shutil.rmtree(os.path.join(self.store_path, session_id), ignore_errors=True)
                count += 1
        return count
