package inbox

import "errors"

// ErrNoMessageID is returned (wrapped) by Inbox.Handle for a record without
// a message id: no Options.MessageIDHeader header, or an empty one, when
// Options.IDFromOffset is off. A retry cannot succeed: a Consumer
// dead-letters such a record at once, or without a DeadLetter writer stops
// with this error (see Consumer); it never skips it.
var ErrNoMessageID = errors.New("inbox: no message id")

// ErrInvalidMessageID is returned (wrapped) by Inbox.Handle for a record
// whose message-id header is longer than MaxMessageIDLength bytes, is not
// valid UTF-8 or holds a NUL byte: it cannot be stored as it is, and a
// shortened id could collide with another. A Consumer treats it as it
// treats ErrNoMessageID.
var ErrInvalidMessageID = errors.New("inbox: invalid message id")
