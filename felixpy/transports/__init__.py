"""Feeds: how calc-graph messages reach the daemon, and status goes back.

Every transport turns a connection into a :class:`~felixpy.transports.base.Feed`
and posts :class:`FeedOpened` / :class:`FeedMessages` / :class:`FeedClosed`
events onto the daemon's queue.  Each message is fully decoded (framing *and*
protobuf *and* a known payload) before it is posted, so nothing half-decoded
reaches a manager; a malformed message closes that feed with a logged reason
and the sequence number, and the daemon carries on.
"""
