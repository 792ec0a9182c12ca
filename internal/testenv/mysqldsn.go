package testenv

import (
	"os"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// MySQLWith opens db's MySQL/MariaDB database (one Open returned) again
// with the DSN changed by edit, e.g. without parseTime or with another loc.
// The pool is closed at cleanup; the database is still dropped by the
// first Open's cleanup.
func MySQLWith(t testing.TB, db *gorm.DB, edit func(c *mysqldrv.Config)) *gorm.DB {
	t.Helper()
	c, err := mysqldrv.ParseDSN(os.Getenv(EnvMySQL))
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", EnvMySQL, err)
	}
	var name string
	if err := db.Raw("SELECT DATABASE()").Scan(&name).Error; err != nil {
		t.Fatalf("testenv: %v", err)
	}
	c = c.Clone()
	c.DBName = name
	c.ParseTime = true
	c.Loc = time.UTC
	edit(c)
	return open(t, MySQL, c.FormatDSN(), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
}
