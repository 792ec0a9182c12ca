package inbox

import "errors"

// ErrNoMessageID is returned (wrapped) by Inbox.Handle for a record without
// a message id (see Inbox.MessageID). A retry cannot succeed: a Consumer
// dead-letters such a record at once, or stops without DeadLetter.
var ErrNoMessageID = errors.New("inbox: no message id")

// ErrInvalidMessageID is returned (wrapped) by Inbox.Handle for a record
// whose message id is longer than MaxMessageIDLength bytes, is not UTF-8 or
// holds a NUL byte (a shortened id could collide). A Consumer treats it as
// ErrNoMessageID.
var ErrInvalidMessageID = errors.New("inbox: invalid message id")
