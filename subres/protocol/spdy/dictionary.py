"""The SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy-00, 2.6.10.1).

Both zlib streams of a session are primed with these 1423 bytes. The draft
lists them as a byte array; here they are rebuilt from what the array means:
a run of common header words, each behind a big-endian u32 length, then a
plain run of status codes, reason phrases, dates and media types.
"""

from __future__ import annotations

import struct

__all__ = ["SPDY3_DICTIONARY", "SPDY3_DICTIONARY_ADLER32"]

_WORDS = (
    "options|head|post|put|delete|trace|accept|accept-charset|accept-encoding"
    "|accept-language|accept-ranges|age|allow|authorization|cache-control|connection"
    "|content-base|content-encoding|content-language|content-length|content-location"
    "|content-md5|content-range|content-type|date|etag|expect|expires|from|host"
    "|if-match|if-modified-since|if-none-match|if-range|if-unmodified-since"
    "|last-modified|location|max-forwards|pragma|proxy-authenticate|proxy-authorization"
    "|range|referer|retry-after|server|te|trailer|transfer-encoding|upgrade|user-agent"
    "|vary|via|warning|www-authenticate|method|get|status|200 OK|version|HTTP/1.1|url"
    "|public|set-cookie|keep-alive|origin"
)
"""Header words, each of which the dictionary holds behind a u32 length."""

_STATUS_CODES = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
)

_TAIL = (
    "203 Non-Authoritative Information"
    "204 No Content"
    "301 Moved Permanently"
    "400 Bad Request"
    "401 Unauthorized"
    "403 Forbidden"
    "404 Not Found"
    "500 Internal Server Error"
    "501 Not Implemented"
    "503 Service Unavailable"
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00"
    " Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,"
    "application/xhtml+xml,text/plain,text/javascript,public"
    "private"
    "max-age="
    "gzip,deflate,sdch"
    "charset=utf-8"
    "charset=iso-8859-1,utf-,*,enq=0."
)


def _build() -> bytes:
    words = b"".join(struct.pack(">I", len(w)) + w.encode("ascii") for w in _WORDS.split("|"))
    return words + (_STATUS_CODES + _TAIL).encode("ascii")


SPDY3_DICTIONARY: bytes = _build()
"""The 1423-byte dictionary, as the zlib ``zdict`` of every header stream."""

SPDY3_DICTIONARY_ADLER32 = 0xE3C6A7C2
"""The dictionary's adler32, which zlib puts in the stream header (FDICT)."""
