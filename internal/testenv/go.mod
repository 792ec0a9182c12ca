module github.com/gorm-outbox/outbox/internal/testenv

go 1.26.0

require github.com/gorm-outbox/outbox v0.0.0-00010101000000-000000000000
