package inbox

import "errors"

// ErrNoMessageID is wrapped by Inbox.Handle's error for a record without a
// message id (see Inbox.MessageID); a Consumer dead-letters it at once.
var ErrNoMessageID = errors.New("inbox: no message id")

// ErrInvalidMessageID is wrapped by Inbox.Handle's error for a message id
// above MaxMessageIDLength bytes, not UTF-8 or holding a NUL byte; a
// Consumer treats it as ErrNoMessageID.
var ErrInvalidMessageID = errors.New("inbox: invalid message id")
