/*
 * tpcc - a TPC-C-like OLTP workload on SQLite in memory (cxlssd guest workload).
 *
 * An in-memory SQLite database (":memory:", 4 KiB pages) holds TPC-C's nine tables for
 * --warehouses W: per warehouse 10 districts of --customers C customers (TPC-C: 3000), C
 * initial orders a district with 5..15 order lines each, the last 30 % of them undelivered
 * (new orders), one history row a customer, and a stock row for each of the --items I
 * items (TPC-C: 100000). Each table is one B-tree clustered on its primary key, TPC-C's
 * composite keys packed into SQLite's integer rowid (as main-memory engines key their TPC-C
 * tables), with TPC-C's two secondary indexes (customers by last name, orders by customer).
 * Money is in integer cents, taxes and discounts in basis points, dates are a logical clock
 * (the transaction's number): every result is exact and deterministic.
 *
 * The measured process keeps the database's pages in a page cache it allocates
 * (SQLITE_CONFIG_PAGECACHE, sized from the parameters with room for the ROI's inserts) and
 * SQLite's other memory in its heap, all placed by the caller (`numactl --membind=N`). The
 * load and the self-check run in child processes on the default (local) node, see
 * run_unbound; the load's database is copied page by page into the page cache. ROI --roi
 * (1) is --transactions N transactions of the TPC-C mix (New-Order 45 %, Payment 43 %,
 * Order-Status, Delivery and Stock-Level 4 % each), each one SQLite transaction of prepared
 * statements, with TPC-C's input distributions (NURand customers and items, 60 % of Payment
 * and Order-Status customers by last name, 1 % of New-Orders rolled back on an unused item,
 * 1 % remote supply and 15 % remote customers when W > 1), from a fixed seed. --warm-passes P
 * runs P x N transactions before the ROI, unmeasured, from the same generator (a ramp-up, as
 * TPC-C's runs have; SkyByte's artifact measures a pass of its trace after a warm-up pass).
 *
 * With --threads T the warehouses are partitioned among T POSIX threads, as main-memory OLTP
 * engines run TPC-C (H-Store, DBx1000: a partition of warehouses a thread): thread k owns a
 * database of its own, a connection holding a contiguous share of the warehouses (each
 * loaded as with one thread) and its copy of the read-only item table, and runs its share
 * of the transactions on them from a generator of its own (thread 0's is the one-thread
 * sequence), so no result depends on the scheduling. Remote supply warehouses and customers
 * are drawn within the thread's partition (when it has more than one warehouse), a
 * deviation from TPC-C. Every connection's pages come from the one page cache.
 *
 * Self-check after the ROI: TPC-C's consistency conditions 1-10 and 12 (clause 3.3.2) as
 * SQL queries, none may find a violation; and the work the transactions committed, as
 * counted by the program (orders, order lines, payments and their amounts, deliveries,
 * stock quantities), must be in the database (both for every partition). The checksum
 * hashes every transaction's results in order, the warm passes' too (a thread's, and with threads their hashes
 * in thread order). One JSON line on stdout; exit 0, 1 if the check failed (or SQLite
 * failed), 2 for a usage error.
 */
#define _GNU_SOURCE /* memfd_create */
#include <linux/mempolicy.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define DISTRICTS 10u
#define DEFAULT_WAREHOUSES 1u
#define DEFAULT_CUSTOMERS 300u
#define DEFAULT_ITEMS 10000u
#define DEFAULT_TRANSACTIONS 100u
#define MAX_WAREHOUSES 10000u
#define MAX_CUSTOMERS 3000u /* TPC-C's */
#define MAX_ITEMS 100000u   /* TPC-C's */
#define PAGE_BYTES 4096

/*
 * The database's size, measured (page_count x page_size after the load, `--customers` and
 * `--items` varied): the model --footprint inverts and the page cache is sized from.
 * A customer brings its row and name index entry, its history row, its initial order and
 * that order's ~10 order lines; a warehouse a stock row an item; the transactions (warm and ROI)
 * add orders, order lines and history rows.
 */
#define BYTES_PER_ITEM 67u
#define BYTES_PER_STOCK 321u
#define BYTES_PER_CUSTOMER 1243u
#define BYTES_PER_TRANSACTION 340u
#define BYTES_FIXED (64u << 10) /* schema, warehouses, districts, partly filled pages */
#define PAGE_CACHE_SLACK 1.10    /* room for B-tree splits the model does not see */
/* SQLite's heap after the load: schema and statements (a connection's), and the page cache's hash table. */
#define HEAP_BYTES (128u << 10)
#define HEAP_BYTES_PER_PAGE 16u

/* Generators (wl_stream): the load, the transactions (thread k's: STREAM_RUN + k). */
#define STREAM_LOAD 1ull
#define STREAM_RUN 2ull

/* TPC-C's constants (money in cents). */
#define INITIAL_YTD_CENTS 1000 /* each customer's one payment: 10.00 */
#define CREDIT_LIMIT_CENTS 5000000
#define UNDELIVERED_PERCENT 30 /* the last 900 of 3000 orders a district */
#define NEW_ORDER_PERCENT 45
#define PAYMENT_PERCENT 43
#define ORDER_STATUS_PERCENT 4
#define DELIVERY_PERCENT 4
#define BY_NAME_PERCENT 60
#define REMOTE_CUSTOMER_PERCENT 15
#define C_DATA_MAX 500

static const char USAGE[] =
    "usage: tpcc [--warehouses W | --footprint BYTES] [--customers C] [--items I]\n"
    "            [--transactions N] [--threads T] [--warm-passes P] [--seed S] [--roi ID]\n"
    "  --warehouses    warehouses (default 1)\n"
    "  --footprint     pick the warehouses so that the database and SQLite's heap fit BYTES\n"
    "                  (~8 MiB a warehouse at the default scale)\n"
    "  --customers     customers a district, 10..3000 (default 300; TPC-C: 3000)\n"
    "  --items         items, each with a stock row a warehouse, 100..100000 (default 10000;\n"
    "                  TPC-C: 100000)\n"
    "  --transactions  transactions of the TPC-C mix in the measured phase (default 100)\n"
    "  --threads       POSIX threads, each running its share of the transactions on a database\n"
    "                  of its own partition of the warehouses, 1..W (default 1)\n"
    "  --warm-passes   P x N transactions before the ROI, unmeasured (default 0)\n" WL_COMMON_USAGE;

struct options {
    uint64_t warehouses, customers, items, transactions, threads, warm_passes;
    uint64_t slot_bytes; /* a page cache slot: a page and SQLite's header for it */
    struct wl_common common;
};

/* The bytes of `partitions` databases holding W warehouses between them and N transactions' work
 * (the measured model above): each has the schema and a copy of the item table. */
static uint64_t database_bytes(uint64_t warehouses, uint64_t partitions, uint64_t customers, uint64_t items,
                               uint64_t transactions)
{
    return partitions * (BYTES_FIXED + items * BYTES_PER_ITEM) +
           warehouses * (items * BYTES_PER_STOCK + DISTRICTS * customers * BYTES_PER_CUSTOMER) +
           transactions * BYTES_PER_TRANSACTION;
}

/* The transactions of a run, the warm passes' and the ROI's: what the databases must hold. */
static uint64_t transactions_in_run(const struct options *opt, uint64_t roi_transactions)
{
    return roi_transactions * (1 + opt->warm_passes);
}

/* The page cache's pages: the databases', with slack. */
static uint64_t page_cache_pages(uint64_t warehouses, uint64_t partitions, uint64_t customers, uint64_t items,
                                 uint64_t transactions)
{
    return (uint64_t)(PAGE_CACHE_SLACK *
                      (double)database_bytes(warehouses, partitions, customers, items, transactions)) /
           PAGE_BYTES;
}

/* The result of an sqlite3_config call (all are made before SQLite starts, which they must be). */
static void configure(int rc)
{
    if (rc != SQLITE_OK) {
        fprintf(stderr, "%s: SQLite refused a configuration: %s\n", wl_program.name, sqlite3_errstr(rc));
        exit(1);
    }
}

/* A page cache slot: a page and the header this process's SQLite puts on it (asked before
 * SQLite starts: it refuses the question after). */
static uint64_t slot_bytes(void)
{
    int header_bytes;
    configure(sqlite3_config(SQLITE_CONFIG_PCACHE_HDRSZ, &header_bytes));
    return PAGE_BYTES + ((uint64_t)header_bytes + 7) / 8 * 8;
}

/* The data's bytes: the page cache and SQLite's heap (schema, statements: a connection a thread). */
static uint64_t footprint_bytes(uint64_t warehouses, const struct options *opt)
{
    return page_cache_pages(warehouses, opt->threads, opt->customers, opt->items,
                            transactions_in_run(opt, opt->transactions)) *
               (opt->slot_bytes + HEAP_BYTES_PER_PAGE) + opt->threads * HEAP_BYTES;
}

static struct options parse_options(int argc, char **argv)
{
    struct options opt = {.warehouses = DEFAULT_WAREHOUSES, .customers = DEFAULT_CUSTOMERS,
                          .items = DEFAULT_ITEMS, .transactions = DEFAULT_TRANSACTIONS, .threads = 1,
                          .slot_bytes = slot_bytes(), .common = WL_COMMON_DEFAULTS};
    struct wl_option options[] = {
        WL_SIZED("warehouses", &opt.warehouses, 1, MAX_WAREHOUSES),
        WL_COUNT("customers", &opt.customers, 10, MAX_CUSTOMERS),
        WL_SIZE("items", &opt.items, 100, MAX_ITEMS),
        WL_SIZE("transactions", &opt.transactions, 0, UINT32_MAX),
        WL_COUNT("threads", &opt.threads, 1, WL_MAX_THREADS),
        WL_WARM_PASSES(&opt.warm_passes),
        WL_END,
    };
    wl_parse(argc, argv, options, &opt.common);
    if (opt.common.footprint != 0) {
        const uint64_t fixed = footprint_bytes(0, &opt), per_warehouse = footprint_bytes(1, &opt) - fixed;
        opt.warehouses = wl_footprint_items(&opt.common, "warehouses", per_warehouse, fixed, 1, MAX_WAREHOUSES);
        if (opt.threads > opt.warehouses)
            wl_usage_error("--threads %" PRIu64 ": --footprint %" PRIu64 " holds %" PRIu64 " warehouses, and each"
                           " thread owns at least one; give --footprint %" PRIu64 " or more, or fewer --threads",
                           opt.threads, opt.common.footprint, opt.warehouses, fixed + opt.threads * per_warehouse);
    } else if (opt.threads > opt.warehouses) {
        wl_usage_error("--threads %" PRIu64 ": more than the %" PRIu64 " warehouses, and each thread owns at least"
                       " one; give --warehouses %" PRIu64 " or more, or fewer --threads",
                       opt.threads, opt.warehouses, opt.threads);
    }
    return opt;
}

/* ---- SQLite ------------------------------------------------------------------------------ */

/* A failed system call: message, exit 1. */
__attribute__((noreturn)) static void system_fail(const char *what)
{
    fprintf(stderr, "%s: %s failed: %s\n", wl_program.name, what, strerror(errno));
    exit(1);
}

__attribute__((noreturn)) static void sqlite_fail(sqlite3 *db, const char *what)
{
    fprintf(stderr, "%s: SQLite failed (%s): %s\n", wl_program.name, what, sqlite3_errmsg(db));
    exit(1);
}

/*
 * Primary keys: the columns of TPC-C's composite keys packed into one integer, SQLite's rowid
 * (as main-memory engines key their TPC-C tables), so each table is one B-tree clustered on
 * its key and a lookup compares integers. The component columns are kept as well.
 */
#define DISTRICT_BITS 4 /* d <= 10 */
#define CUSTOMER_BITS 12 /* c <= 3000 */
#define ORDER_BITS 32
#define LINE_BITS 4  /* ol_number <= 15 */
#define ITEM_BITS 17 /* i <= 100000 */
#define STR_(x) #x
#define STR(x) STR_(x)

static int64_t district_key(int64_t w, int64_t d)
{
    return w << DISTRICT_BITS | d;
}

static int64_t customer_key(int64_t w, int64_t d, int64_t c)
{
    return district_key(w, d) << CUSTOMER_BITS | c;
}

static int64_t order_key(int64_t w, int64_t d, int64_t o)
{
    return district_key(w, d) << ORDER_BITS | o;
}

/* Order o's line `number` (0: below its first line). */
static int64_t line_key(int64_t w, int64_t d, int64_t o, int64_t number)
{
    return order_key(w, d, o) << LINE_BITS | number;
}

static int64_t stock_key(int64_t w, int64_t i)
{
    return w << ITEM_BITS | i;
}

static const char SCHEMA[] =
    "CREATE TABLE warehouse (w_id INTEGER PRIMARY KEY, w_name TEXT, w_street_1 TEXT, w_street_2 TEXT,"
    " w_city TEXT, w_state TEXT, w_zip TEXT, w_tax INTEGER, w_ytd INTEGER);"
    "CREATE TABLE district (d_key INTEGER PRIMARY KEY, d_w_id INTEGER, d_id INTEGER, d_name TEXT,"
    " d_street_1 TEXT, d_street_2 TEXT, d_city TEXT, d_state TEXT, d_zip TEXT, d_tax INTEGER, d_ytd INTEGER,"
    " d_next_o_id INTEGER);"
    "CREATE TABLE customer (c_key INTEGER PRIMARY KEY, c_w_id INTEGER, c_d_id INTEGER, c_id INTEGER,"
    " c_first TEXT, c_middle TEXT, c_last TEXT, c_street_1 TEXT, c_street_2 TEXT, c_city TEXT, c_state TEXT,"
    " c_zip TEXT, c_phone TEXT, c_since INTEGER, c_credit TEXT, c_credit_lim INTEGER, c_discount INTEGER,"
    " c_balance INTEGER, c_ytd_payment INTEGER, c_payment_cnt INTEGER, c_delivery_cnt INTEGER, c_data TEXT);"
    "CREATE TABLE history (h_c_id INTEGER, h_c_d_id INTEGER, h_c_w_id INTEGER, h_d_id INTEGER,"
    " h_w_id INTEGER, h_date INTEGER, h_amount INTEGER, h_data TEXT);"
    "CREATE TABLE orders (o_key INTEGER PRIMARY KEY, o_w_id INTEGER, o_d_id INTEGER, o_id INTEGER,"
    " o_c_id INTEGER, o_entry_d INTEGER, o_carrier_id INTEGER, o_ol_cnt INTEGER, o_all_local INTEGER);"
    "CREATE TABLE new_order (no_key INTEGER PRIMARY KEY, no_w_id INTEGER, no_d_id INTEGER, no_o_id INTEGER);"
    "CREATE TABLE order_line (ol_key INTEGER PRIMARY KEY, ol_w_id INTEGER, ol_d_id INTEGER, ol_o_id INTEGER,"
    " ol_number INTEGER, ol_i_id INTEGER, ol_supply_w_id INTEGER, ol_delivery_d INTEGER, ol_quantity INTEGER,"
    " ol_amount INTEGER, ol_dist_info TEXT);"
    "CREATE TABLE item (i_id INTEGER PRIMARY KEY, i_im_id INTEGER, i_name TEXT, i_price INTEGER, i_data TEXT);"
    "CREATE TABLE stock (s_key INTEGER PRIMARY KEY, s_w_id INTEGER, s_i_id INTEGER, s_quantity INTEGER,"
    " s_dist_01 TEXT, s_dist_02 TEXT, s_dist_03 TEXT, s_dist_04 TEXT, s_dist_05 TEXT, s_dist_06 TEXT,"
    " s_dist_07 TEXT, s_dist_08 TEXT, s_dist_09 TEXT, s_dist_10 TEXT, s_ytd INTEGER, s_order_cnt INTEGER,"
    " s_remote_cnt INTEGER, s_data TEXT);";

/* TPC-C's secondary indexes, built after the load (a sort each) as bulk loaders do. */
static const char INDEXES[] = "CREATE INDEX customer_name ON customer (c_w_id, c_d_id, c_last, c_first);"
                              "CREATE INDEX orders_customer ON orders (o_w_id, o_d_id, o_c_id, o_id);";

enum stmt {
    BEGIN, COMMIT, ROLLBACK,
    /* New-Order */
    NO_WAREHOUSE, NO_DISTRICT, NO_DISTRICT_NEXT, NO_CUSTOMER, INSERT_ORDER, INSERT_NEW_ORDER, NO_ITEM,
    NO_STOCK, NO_STOCK_UPDATE, INSERT_ORDER_LINE,
    /* Payment */
    PAY_WAREHOUSE, PAY_WAREHOUSE_NAME, PAY_DISTRICT, PAY_DISTRICT_NAME, CUSTOMER_BY_NAME, PAY_CUSTOMER,
    PAY_CUSTOMER_UPDATE, INSERT_HISTORY,
    /* Order-Status */
    OS_CUSTOMER, OS_LAST_ORDER, OS_ORDER_LINES,
    /* Delivery */
    DL_OLDEST, DL_DELETE, DL_ORDER, DL_CARRIER, DL_LINES, DL_AMOUNT, DL_CUSTOMER,
    /* Stock-Level */
    SL_NEXT_ORDER, SL_LOW_STOCK,
    /* the rest of the load */
    INSERT_ITEM, INSERT_WAREHOUSE, INSERT_STOCK, INSERT_DISTRICT, INSERT_CUSTOMER,
    STMT_COUNT
};

/* An order's lines: keys ?1 (its line 0) + 1..15. */
#define ORDER_LINES_OF_1 "ol_key BETWEEN ?1 AND ?1 + 15"

static const char *const SQL[STMT_COUNT] = {
    [BEGIN] = "BEGIN",
    [COMMIT] = "COMMIT",
    [ROLLBACK] = "ROLLBACK",
    [NO_WAREHOUSE] = "SELECT w_tax FROM warehouse WHERE w_id = ?1",
    [NO_DISTRICT] = "SELECT d_tax, d_next_o_id FROM district WHERE d_key = ?1",
    [NO_DISTRICT_NEXT] = "UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_key = ?1",
    [NO_CUSTOMER] = "SELECT c_discount, c_last, c_credit FROM customer WHERE c_key = ?1",
    [INSERT_ORDER] = "INSERT INTO orders VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    [INSERT_NEW_ORDER] = "INSERT INTO new_order VALUES (?1, ?2, ?3, ?4)",
    [NO_ITEM] = "SELECT i_price, i_name, i_data FROM item WHERE i_id = ?1",
    [NO_STOCK] = "SELECT s_quantity, s_data, CASE ?2 WHEN 1 THEN s_dist_01 WHEN 2 THEN s_dist_02"
                 " WHEN 3 THEN s_dist_03 WHEN 4 THEN s_dist_04 WHEN 5 THEN s_dist_05 WHEN 6 THEN s_dist_06"
                 " WHEN 7 THEN s_dist_07 WHEN 8 THEN s_dist_08 WHEN 9 THEN s_dist_09 ELSE s_dist_10 END"
                 " FROM stock WHERE s_key = ?1",
    [NO_STOCK_UPDATE] = "UPDATE stock SET s_quantity = ?2, s_ytd = s_ytd + ?3, s_order_cnt = s_order_cnt + 1,"
                        " s_remote_cnt = s_remote_cnt + ?4 WHERE s_key = ?1",
    [INSERT_ORDER_LINE] = "INSERT INTO order_line VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    [PAY_WAREHOUSE] = "UPDATE warehouse SET w_ytd = w_ytd + ?2 WHERE w_id = ?1",
    [PAY_WAREHOUSE_NAME] = "SELECT w_name, w_street_1, w_street_2, w_city, w_state, w_zip FROM warehouse"
                           " WHERE w_id = ?1",
    [PAY_DISTRICT] = "UPDATE district SET d_ytd = d_ytd + ?2 WHERE d_key = ?1",
    [PAY_DISTRICT_NAME] = "SELECT d_name, d_street_1, d_street_2, d_city, d_state, d_zip FROM district"
                          " WHERE d_key = ?1",
    /* The key (in c_id's order) breaks ties of first names: the index holds it, no sort needed. */
    [CUSTOMER_BY_NAME] = "SELECT c_key FROM customer WHERE c_w_id = ?1 AND c_d_id = ?2 AND c_last = ?3"
                         " ORDER BY c_first, c_key",
    [PAY_CUSTOMER] = "SELECT c_first, c_middle, c_last, c_street_1, c_street_2, c_city, c_state, c_zip,"
                     " c_phone, c_since, c_credit, c_credit_lim, c_discount, c_balance FROM customer"
                     " WHERE c_key = ?1",
    /* A bad-credit customer's data gets the payment prepended (?3), kept to 500 characters. */
    [PAY_CUSTOMER_UPDATE] = "UPDATE customer SET c_balance = c_balance - ?2, c_ytd_payment = c_ytd_payment + ?2,"
                            " c_payment_cnt = c_payment_cnt + 1, c_data = CASE c_credit WHEN 'BC'"
                            " THEN substr(?3 || c_data, 1, " STR(C_DATA_MAX) ") ELSE c_data END WHERE c_key = ?1",
    [INSERT_HISTORY] = "INSERT INTO history VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    [OS_CUSTOMER] = "SELECT c_balance, c_first, c_middle, c_last FROM customer WHERE c_key = ?1",
    [OS_LAST_ORDER] = "SELECT o_id, o_entry_d, o_carrier_id FROM orders WHERE o_w_id = ?1 AND o_d_id = ?2"
                      " AND o_c_id = ?3 ORDER BY o_id DESC LIMIT 1",
    [OS_ORDER_LINES] = "SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d FROM order_line"
                       " WHERE " ORDER_LINES_OF_1,
    /* The district's orders are keys ?1 (its order 0) + 1.. */
    [DL_OLDEST] = "SELECT no_o_id FROM new_order WHERE no_key > ?1 AND no_key < ?1 + (1 << " STR(ORDER_BITS) ")"
                  " ORDER BY no_key LIMIT 1",
    [DL_DELETE] = "DELETE FROM new_order WHERE no_key = ?1",
    [DL_ORDER] = "SELECT o_c_id FROM orders WHERE o_key = ?1",
    [DL_CARRIER] = "UPDATE orders SET o_carrier_id = ?2 WHERE o_key = ?1",
    [DL_LINES] = "UPDATE order_line SET ol_delivery_d = ?2 WHERE " ORDER_LINES_OF_1,
    [DL_AMOUNT] = "SELECT sum(ol_amount) FROM order_line WHERE " ORDER_LINES_OF_1,
    [DL_CUSTOMER] = "UPDATE customer SET c_balance = c_balance + ?2, c_delivery_cnt = c_delivery_cnt + 1"
                    " WHERE c_key = ?1",
    [SL_NEXT_ORDER] = "SELECT d_next_o_id FROM district WHERE d_key = ?1",
    /* The lines of the district's last 20 orders (keys ?1..?2), their stock in warehouse ?3's keys. */
    [SL_LOW_STOCK] = "SELECT count(DISTINCT s_i_id) FROM order_line JOIN stock ON s_key = ?3 + ol_i_id"
                     " WHERE ol_key >= ?1 AND ol_key < ?2 AND s_quantity < ?4",
    [INSERT_ITEM] = "INSERT INTO item VALUES (?1, ?2, ?3, ?4, ?5)",
    [INSERT_WAREHOUSE] = "INSERT INTO warehouse VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    [INSERT_STOCK] = "INSERT INTO stock VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,"
                     " ?15, ?16, ?17, ?18)",
    [INSERT_DISTRICT] = "INSERT INTO district VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    [INSERT_CUSTOMER] = "INSERT INTO customer VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13,"
                        " ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
};

struct db {
    sqlite3 *handle;
    sqlite3_stmt *stmt[STMT_COUNT];
};

/* A parameter value that binds SQL NULL (no column of the schema holds it). */
#define SQL_NULL INT64_MIN

/* Statement `s` with its integer parameters ?1.. set to `values` (SQL_NULL: NULL). */
static sqlite3_stmt *bind(struct db *db, enum stmt s, const int64_t *values, int count)
{
    sqlite3_stmt *stmt = db->stmt[s];
    for (int i = 0; i < count; i++) {
        const int rc = values[i] == SQL_NULL ? sqlite3_bind_null(stmt, i + 1)
                                             : sqlite3_bind_int64(stmt, i + 1, values[i]);
        if (rc != SQLITE_OK)
            sqlite_fail(db->handle, SQL[s]);
    }
    return stmt;
}

/* Parameter ?`index` of `stmt` to `text` (not copied: it must live until the statement is reset). */
static void bind_text(struct db *db, sqlite3_stmt *stmt, int index, const char *text)
{
    if (sqlite3_bind_text(stmt, index, text, -1, SQLITE_STATIC) != SQLITE_OK)
        sqlite_fail(db->handle, sqlite3_sql(stmt));
}

/* The next row of `stmt`: true with a row, false when done (the statement is then reset). */
static bool next_row(struct db *db, sqlite3_stmt *stmt)
{
    const int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW)
        return true;
    if (rc != SQLITE_DONE)
        sqlite_fail(db->handle, sqlite3_sql(stmt));
    sqlite3_reset(stmt);
    return false;
}

/* Done with `stmt` before its last row. */
static void finish(sqlite3_stmt *stmt)
{
    sqlite3_reset(stmt);
}

/* Run a statement that returns no row. */
static void run(struct db *db, sqlite3_stmt *stmt)
{
    if (next_row(db, stmt)) {
        fprintf(stderr, "%s: '%s' returned a row\n", wl_program.name, sqlite3_sql(stmt));
        exit(1);
    }
}

/* The first row of a statement that must return one (or false if `optional` and there is none). */
static bool one_row(struct db *db, sqlite3_stmt *stmt, bool optional)
{
    if (next_row(db, stmt))
        return true;
    if (!optional) {
        fprintf(stderr, "%s: '%s' found no row\n", wl_program.name, sqlite3_sql(stmt));
        exit(1);
    }
    return false;
}

#define ARGS(...) (const int64_t[]){__VA_ARGS__}, (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define EXEC(db, s, ...) run((db), bind((db), (s), ARGS(__VA_ARGS__)))
#define QUERY(db, s, ...) bind((db), (s), ARGS(__VA_ARGS__))

static int64_t column(sqlite3_stmt *stmt, int index)
{
    return sqlite3_column_int64(stmt, index);
}

static void exec_sql(sqlite3 *db, const char *sql)
{
    if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK)
        sqlite_fail(db, sql);
}

/* secure_delete off: Debian's build zeroes deleted content by default, a database server does not. */
static void set_pragmas(sqlite3 *db)
{
    exec_sql(db, "PRAGMA page_size = " STR(PAGE_BYTES) "; PRAGMA temp_store = MEMORY; PRAGMA secure_delete = OFF;");
}

/*
 * SQLite's process-wide configuration, made once before it starts: the pages of every
 * database in `page_cache` (`slots` slots of `slot_bytes`; NULL: SQLite's own). One thread:
 * single-thread mode, no mutex at all. Threads: multi-thread mode (a connection is used by
 * one thread at a time; what the connections share, the allocator and the page cache's
 * slots, is under SQLite's mutexes), which needs a library built thread-safe (Debian's is,
 * SQLITE_THREADSAFE=1).
 */
static void configure_sqlite(uint64_t threads, void *page_cache, int slot_bytes, int slots)
{
    if (threads > 1 && !sqlite3_threadsafe()) {
        fprintf(stderr, "%s: --threads %" PRIu64 " needs a thread-safe SQLite; this one (%s) has no mutexes\n",
                wl_program.name, threads, sqlite3_libversion());
        exit(1);
    }
    configure(sqlite3_config(threads > 1 ? SQLITE_CONFIG_MULTITHREAD : SQLITE_CONFIG_SINGLETHREAD));
    if (page_cache != NULL)
        configure(sqlite3_config(SQLITE_CONFIG_PAGECACHE, page_cache, slot_bytes, slots));
}

/*
 * An in-memory database, its connection used by one thread at a time (no mutex of its own),
 * temporary tables and sorts (Stock-Level's DISTINCT, the index builds, the check's GROUP
 * BYs) in memory too.
 */
static void db_open(struct db *db)
{
    if (sqlite3_open_v2(":memory:", &db->handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK)
        sqlite_fail(db->handle, "to open the database");
    set_pragmas(db->handle);
}

static void db_prepare(struct db *db)
{
    for (int s = 0; s < STMT_COUNT; s++)
        if (sqlite3_prepare_v3(db->handle, SQL[s], -1, SQLITE_PREPARE_PERSISTENT, &db->stmt[s], NULL) != SQLITE_OK)
            sqlite_fail(db->handle, SQL[s]);
}

/* ---- TPC-C's data --------------------------------------------------------------------------- */

static int64_t uniform(uint64_t *state, int64_t low, int64_t high)
{
    return low + (int64_t)wl_below(state, (uint64_t)(high - low + 1));
}

static bool percent(uint64_t *state, unsigned chance)
{
    return wl_below(state, 100) < chance;
}

/* TPC-C's non-uniform random NURand(A, x, y) with run constant c (clause 2.1.6). */
static int64_t nurand(uint64_t *state, int64_t a, int64_t c, int64_t low, int64_t high)
{
    return ((uniform(state, 0, a) | uniform(state, low, high)) + c) % (high - low + 1) + low;
}

/* A random string of [low, high] characters from `alphabet` into `text` (NUL-terminated). */
static void random_text(uint64_t *state, char *text, int low, int high, const char *alphabet, uint64_t letters)
{
    const int64_t length = uniform(state, low, high);
    for (int64_t i = 0; i < length; i++)
        text[i] = alphabet[wl_below(state, letters)];
    text[length] = '\0';
}

static const char ALPHANUMERIC[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

static void a_string(uint64_t *state, char *text, int low, int high)
{
    random_text(state, text, low, high, ALPHANUMERIC, sizeof ALPHANUMERIC - 1);
}

static void n_string(uint64_t *state, char *text, int low, int high)
{
    random_text(state, text, low, high, "0123456789", 10);
}

/* I_DATA and S_DATA: 26..50 characters, 10 % of them holding "ORIGINAL" somewhere. */
static void data_string(uint64_t *state, char *text)
{
    a_string(state, text, 26, 50);
    if (percent(state, 10)) {
        const size_t length = strlen(text), at = (size_t)wl_below(state, length - 8 + 1);
        memcpy(text + at, "ORIGINAL", 8);
    }
}

static void zip_code(uint64_t *state, char *text)
{
    n_string(state, text, 4, 4);
    memcpy(text + 4, "11111", 6);
}

/* Customer last name `number` (0..999): three syllables, its decimal digits. */
static void last_name(int64_t number, char *text)
{
    static const char *const SYLLABLES[] = {"BAR", "OUGHT", "ABLE", "PRI", "PRES",
                                            "ESE", "ANTI", "CALLY", "ATION", "EING"};
    snprintf(text, 16, "%s%s%s", SYLLABLES[number / 100], SYLLABLES[number / 10 % 10], SYLLABLES[number % 10]);
}

/* An address's street 1, street 2, city, state and zip into 5 strings of 21 bytes. */
static void address(uint64_t *state, char fields[5][21])
{
    a_string(state, fields[0], 10, 20);
    a_string(state, fields[1], 10, 20);
    a_string(state, fields[2], 10, 20);
    a_string(state, fields[3], 2, 2);
    zip_code(state, fields[4]);
}

/* Bind an address to parameters ?first..?first+4. */
static void bind_address(struct db *db, sqlite3_stmt *stmt, int first, char fields[5][21])
{
    for (int i = 0; i < 5; i++)
        bind_text(db, stmt, first + i, fields[i]);
}

/* ---- the benchmark's state ------------------------------------------------------------------ */

/* The work committed in the ROI, counted by the program: the check finds it in the database. */
struct totals {
    uint64_t new_orders, rollbacks, payments, order_status, deliveries, stock_levels;
    uint64_t order_lines, quantity, remote_lines, delivered, payment_cents;
};

/* A thread's benchmark: its partition's database, parameters and generator (one thread: all of it). */
struct tpcc {
    _Alignas(64) struct db db; /* cache lines of its own: the threads' hot fields share none */
    int64_t first_warehouse, warehouses; /* the partition: warehouses first_warehouse.. (W of them) */
    uint64_t transactions;               /* the thread's share of the ROI's */
    int64_t customers, items;
    int64_t names;       /* distinct last names a district: min(1000, C / 3), as 1000 of 3000 */
    int64_t undelivered; /* initial new orders a district: the last 30 % */
    int64_t initial_lines;
    uint64_t seed;
    int64_t c_last_load, c_last_run, c_id, ol_i_id; /* NURand's constants */
    uint32_t *by_name;                              /* the customers a name lookup found */
    uint64_t state;                                 /* the transactions' generator */
    int64_t clock;                                  /* the logical time: the transaction's number */
    uint64_t hash;                                  /* of every transaction's results */
    struct totals totals;
};

static void add_result(struct tpcc *t, int64_t value)
{
    t->hash = wl_hash(t->hash, (uint64_t)value);
}

/* ---- the load (clause 4.3.3) ---------------------------------------------------------------- */

static void load_items(struct tpcc *t, uint64_t *state)
{
    struct db *db = &t->db;
    char name[25], data[51];
    for (int64_t i = 1; i <= t->items; i++) {
        a_string(state, name, 14, 24);
        data_string(state, data);
        sqlite3_stmt *stmt = QUERY(db, INSERT_ITEM, i, uniform(state, 1, 10000), 0, uniform(state, 100, 10000));
        bind_text(db, stmt, 3, name);
        bind_text(db, stmt, 5, data);
        run(db, stmt);
    }
}

static void load_stock(struct tpcc *t, uint64_t *state, int64_t w)
{
    struct db *db = &t->db;
    char dist[DISTRICTS][25], data[51];
    for (int64_t i = 1; i <= t->items; i++) {
        for (unsigned d = 0; d < DISTRICTS; d++)
            a_string(state, dist[d], 24, 24);
        data_string(state, data);
        /* the districts' texts (?5..?14) and the data (?18) are bound below */
        sqlite3_stmt *stmt = QUERY(db, INSERT_STOCK, stock_key(w, i), w, i, uniform(state, 10, 100), 0, 0, 0, 0, 0,
                                   0, 0, 0, 0, 0, 0, 0, 0);
        for (unsigned d = 0; d < DISTRICTS; d++)
            bind_text(db, stmt, 5 + (int)d, dist[d]);
        bind_text(db, stmt, 18, data);
        run(db, stmt);
    }
}

static void load_customer(struct tpcc *t, uint64_t *state, int64_t w, int64_t d, int64_t c)
{
    struct db *db = &t->db;
    char first[17], last[16], phone[17], data[C_DATA_MAX + 1], history_data[25], fields[5][21];
    const int64_t name = c <= t->names ? c - 1 : nurand(state, 255, t->c_last_load, 0, t->names - 1);
    last_name(name, last);
    a_string(state, first, 8, 16);
    address(state, fields);
    n_string(state, phone, 16, 16);
    a_string(state, data, 300, C_DATA_MAX);
    /* the texts (?5..?13, ?15, ?22) are bound below */
    sqlite3_stmt *stmt = QUERY(db, INSERT_CUSTOMER, customer_key(w, d, c), w, d, c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                               0, CREDIT_LIMIT_CENTS, uniform(state, 0, 5000), -INITIAL_YTD_CENTS,
                               INITIAL_YTD_CENTS, 1, 0);
    bind_text(db, stmt, 5, first);
    bind_text(db, stmt, 6, "OE");
    bind_text(db, stmt, 7, last);
    bind_address(db, stmt, 8, fields);
    bind_text(db, stmt, 13, phone);
    bind_text(db, stmt, 15, percent(state, 10) ? "BC" : "GC");
    bind_text(db, stmt, 22, data);
    run(db, stmt);

    a_string(state, history_data, 12, 24);
    stmt = QUERY(db, INSERT_HISTORY, c, d, w, d, w, 0, INITIAL_YTD_CENTS);
    bind_text(db, stmt, 8, history_data);
    run(db, stmt);
}

/* District (w, d)'s initial orders: one a customer (a random permutation), the last 30 % undelivered. */
static void load_orders(struct tpcc *t, uint64_t *state, int64_t w, int64_t d)
{
    struct db *db = &t->db;
    const struct wl_scramble customer_of = wl_scramble_make((uint64_t)t->customers, wl_next(state));
    const int64_t delivered = t->customers - t->undelivered;
    char dist_info[25];
    for (int64_t o = 1; o <= t->customers; o++) {
        const bool done = o <= delivered;
        const int64_t lines = uniform(state, 5, 15);
        EXEC(db, INSERT_ORDER, order_key(w, d, o), w, d, o, (int64_t)wl_scramble(&customer_of, (uint64_t)o - 1) + 1,
             0, done ? uniform(state, 1, 10) : SQL_NULL, lines, 1);
        for (int64_t l = 1; l <= lines; l++) {
            a_string(state, dist_info, 24, 24);
            sqlite3_stmt *stmt = QUERY(db, INSERT_ORDER_LINE, line_key(w, d, o, l), w, d, o, l,
                                       uniform(state, 1, t->items), w, done ? 0 : SQL_NULL, 5,
                                       done ? 0 : uniform(state, 1, 999999));
            bind_text(db, stmt, 11, dist_info);
            run(db, stmt);
        }
        t->initial_lines += lines;
        if (!done)
            EXEC(db, INSERT_NEW_ORDER, order_key(w, d, o), w, d, o);
    }
}

/* The partition's database; `state` is the generator of its first warehouse, left at the next
 * partition's: a warehouse's data is the same for any number of partitions. */
static void load(struct tpcc *t, uint64_t *state)
{
    struct db *db = &t->db;
    /* The stream's first draws: the same items in every partition's copy of the table. */
    uint64_t items = wl_stream(t->seed, STREAM_LOAD);
    char name[11], fields[5][21];
    run(db, db->stmt[BEGIN]);
    load_items(t, &items);
    if (t->first_warehouse == 1)
        *state = items; /* warehouse 1's draws follow the items' */
    for (int64_t w = t->first_warehouse; w < t->first_warehouse + t->warehouses; w++) {
        a_string(state, name, 6, 10);
        address(state, fields);
        sqlite3_stmt *stmt = QUERY(db, INSERT_WAREHOUSE, w, 0, 0, 0, 0, 0, 0, uniform(state, 0, 2000),
                                   DISTRICTS * t->customers * INITIAL_YTD_CENTS);
        bind_text(db, stmt, 2, name);
        bind_address(db, stmt, 3, fields);
        run(db, stmt);
        load_stock(t, state, w);
        for (int64_t d = 1; d <= DISTRICTS; d++) {
            a_string(state, name, 6, 10);
            address(state, fields);
            stmt = QUERY(db, INSERT_DISTRICT, district_key(w, d), w, d, 0, 0, 0, 0, 0, 0, uniform(state, 0, 2000),
                         t->customers * INITIAL_YTD_CENTS, t->customers + 1);
            bind_text(db, stmt, 4, name);
            bind_address(db, stmt, 5, fields);
            run(db, stmt);
            for (int64_t c = 1; c <= t->customers; c++)
                load_customer(t, state, w, d, c);
            load_orders(t, state, w, d);
        }
    }
    run(db, db->stmt[COMMIT]);
    exec_sql(db->handle, INDEXES);
}

/* ---- the transactions (clause 2) ---------------------------------------------------------- */

/* A warehouse of the partition other than `w` (W > 1). */
static int64_t other_warehouse(struct tpcc *t, int64_t w)
{
    const int64_t other = uniform(&t->state, t->first_warehouse, t->first_warehouse + t->warehouses - 2);
    return other < w ? other : other + 1;
}

static void new_order(struct tpcc *t, int64_t w)
{
    struct db *db = &t->db;
    uint64_t *state = &t->state;
    const int64_t d = uniform(state, 1, DISTRICTS), c = nurand(state, 1023, t->c_id, 1, t->customers);
    const int64_t lines = uniform(state, 5, 15);
    const bool rollback = percent(state, 1); /* its last item is an unused number */
    int64_t item[15], supply[15], quantity[15];
    bool all_local = true;
    for (int64_t l = 0; l < lines; l++) {
        item[l] = rollback && l == lines - 1 ? t->items + 1 : nurand(state, 8191, t->ol_i_id, 1, t->items);
        supply[l] = t->warehouses > 1 && percent(state, 1) ? other_warehouse(t, w) : w;
        quantity[l] = uniform(state, 1, 10);
        all_local = all_local && supply[l] == w;
    }

    run(db, db->stmt[BEGIN]);
    sqlite3_stmt *stmt = QUERY(db, NO_WAREHOUSE, w);
    one_row(db, stmt, false);
    const int64_t w_tax = column(stmt, 0);
    finish(stmt);
    stmt = QUERY(db, NO_DISTRICT, district_key(w, d));
    one_row(db, stmt, false);
    const int64_t d_tax = column(stmt, 0), o = column(stmt, 1);
    finish(stmt);
    EXEC(db, NO_DISTRICT_NEXT, district_key(w, d));
    stmt = QUERY(db, NO_CUSTOMER, customer_key(w, d, c));
    one_row(db, stmt, false);
    const int64_t discount = column(stmt, 0);
    finish(stmt);
    EXEC(db, INSERT_ORDER, order_key(w, d, o), w, d, o, c, t->clock, SQL_NULL, lines, all_local);
    EXEC(db, INSERT_NEW_ORDER, order_key(w, d, o), w, d, o);

    int64_t amount = 0, quantities = 0, remote = 0;
    for (int64_t l = 0; l < lines; l++) {
        stmt = QUERY(db, NO_ITEM, item[l]);
        if (!one_row(db, stmt, true)) { /* the unused item: the whole order is rolled back */
            run(db, db->stmt[ROLLBACK]);
            t->totals.rollbacks++;
            add_result(t, -o);
            return;
        }
        const int64_t price = column(stmt, 0);
        const bool original = strstr((const char *)sqlite3_column_text(stmt, 2), "ORIGINAL") != NULL;
        finish(stmt);

        stmt = QUERY(db, NO_STOCK, stock_key(supply[l], item[l]), d);
        one_row(db, stmt, false);
        const int64_t stock = column(stmt, 0);
        const bool brand = original && strstr((const char *)sqlite3_column_text(stmt, 1), "ORIGINAL") != NULL;
        char dist_info[25];
        snprintf(dist_info, sizeof dist_info, "%s", (const char *)sqlite3_column_text(stmt, 2));
        finish(stmt);
        const int64_t left = stock >= quantity[l] + 10 ? stock - quantity[l] : stock - quantity[l] + 91;
        EXEC(db, NO_STOCK_UPDATE, stock_key(supply[l], item[l]), left, quantity[l], supply[l] != w);

        const int64_t line_amount = quantity[l] * price;
        stmt = QUERY(db, INSERT_ORDER_LINE, line_key(w, d, o, l + 1), w, d, o, l + 1, item[l], supply[l], SQL_NULL,
                     quantity[l], line_amount);
        bind_text(db, stmt, 11, dist_info);
        run(db, stmt);
        amount += line_amount;
        quantities += quantity[l];
        remote += supply[l] != w;
        add_result(t, left << 1 | brand);
    }
    run(db, db->stmt[COMMIT]);
    /* The order's total: the amounts less the discount, plus the taxes (basis points). */
    add_result(t, o);
    add_result(t, amount * (10000 - discount) / 10000 * (10000 + w_tax + d_tax) / 10000);
    t->totals.new_orders++;
    t->totals.order_lines += (uint64_t)lines;
    t->totals.quantity += (uint64_t)quantities;
    t->totals.remote_lines += (uint64_t)remote;
}

/* The customer of a Payment or Order-Status in district (w, d): 60 % by last name (the middle
 * one of those with the name, ordered by first name), 40 % by number. */
static int64_t pick_customer(struct tpcc *t, int64_t w, int64_t d)
{
    struct db *db = &t->db;
    if (!percent(&t->state, BY_NAME_PERCENT))
        return nurand(&t->state, 1023, t->c_id, 1, t->customers);
    char last[16];
    last_name(nurand(&t->state, 255, t->c_last_run, 0, t->names - 1), last);
    sqlite3_stmt *stmt = QUERY(db, CUSTOMER_BY_NAME, w, d);
    bind_text(db, stmt, 3, last);
    uint64_t found = 0;
    while (next_row(db, stmt))
        t->by_name[found++] = (uint32_t)(column(stmt, 0) & ((1 << CUSTOMER_BITS) - 1)); /* at most C */
    if (found == 0) { /* every name 0..names-1 is given to one of the first customers */
        fprintf(stderr, "%s: no customer named %s in district %" PRId64 ".%" PRId64 "\n", wl_program.name, last, w, d);
        exit(1);
    }
    return t->by_name[(found - 1) / 2];
}

static void payment(struct tpcc *t, int64_t w)
{
    struct db *db = &t->db;
    uint64_t *state = &t->state;
    const int64_t d = uniform(state, 1, DISTRICTS), amount = uniform(state, 100, 500000);
    const bool remote = t->warehouses > 1 && percent(state, REMOTE_CUSTOMER_PERCENT);
    const int64_t c_w = remote ? other_warehouse(t, w) : w, c_d = remote ? uniform(state, 1, DISTRICTS) : d;

    run(db, db->stmt[BEGIN]);
    EXEC(db, PAY_WAREHOUSE, w, amount);
    sqlite3_stmt *stmt = QUERY(db, PAY_WAREHOUSE_NAME, w);
    one_row(db, stmt, false);
    char history_data[25];
    const int length = snprintf(history_data, sizeof history_data, "%s    ", (const char *)sqlite3_column_text(stmt, 0));
    finish(stmt);
    EXEC(db, PAY_DISTRICT, district_key(w, d), amount);
    stmt = QUERY(db, PAY_DISTRICT_NAME, district_key(w, d));
    one_row(db, stmt, false);
    snprintf(history_data + length, sizeof history_data - (size_t)length, "%s", (const char *)sqlite3_column_text(stmt, 0));
    finish(stmt);

    const int64_t c = pick_customer(t, c_w, c_d);
    stmt = QUERY(db, PAY_CUSTOMER, customer_key(c_w, c_d, c));
    one_row(db, stmt, false);
    const int64_t balance = column(stmt, 13);
    finish(stmt);
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " | ", c,
             c_d, c_w, d, w, amount);
    stmt = QUERY(db, PAY_CUSTOMER_UPDATE, customer_key(c_w, c_d, c), amount);
    bind_text(db, stmt, 3, prefix);
    run(db, stmt);
    stmt = QUERY(db, INSERT_HISTORY, c, c_d, c_w, d, w, t->clock, amount);
    bind_text(db, stmt, 8, history_data);
    run(db, stmt);
    run(db, db->stmt[COMMIT]);
    add_result(t, c);
    add_result(t, balance - amount);
    t->totals.payments++;
    t->totals.payment_cents += (uint64_t)amount;
}

static void order_status(struct tpcc *t, int64_t w)
{
    struct db *db = &t->db;
    const int64_t d = uniform(&t->state, 1, DISTRICTS);
    run(db, db->stmt[BEGIN]);
    const int64_t c = pick_customer(t, w, d);
    sqlite3_stmt *stmt = QUERY(db, OS_CUSTOMER, customer_key(w, d, c));
    one_row(db, stmt, false);
    add_result(t, column(stmt, 0));
    finish(stmt);
    stmt = QUERY(db, OS_LAST_ORDER, w, d, c); /* every customer has an order from the load */
    one_row(db, stmt, false);
    const int64_t o = column(stmt, 0);
    add_result(t, o);
    add_result(t, column(stmt, 2));
    finish(stmt);
    stmt = QUERY(db, OS_ORDER_LINES, line_key(w, d, o, 0));
    while (next_row(db, stmt))
        add_result(t, column(stmt, 0) << 24 ^ column(stmt, 2) << 20 ^ column(stmt, 3) ^ column(stmt, 4) << 40);
    run(db, db->stmt[COMMIT]);
    t->totals.order_status++;
}

/* The oldest undelivered order of each district of `w`, delivered in one transaction. */
static void delivery(struct tpcc *t, int64_t w)
{
    struct db *db = &t->db;
    const int64_t carrier = uniform(&t->state, 1, 10);
    run(db, db->stmt[BEGIN]);
    for (int64_t d = 1; d <= DISTRICTS; d++) {
        sqlite3_stmt *stmt = QUERY(db, DL_OLDEST, order_key(w, d, 0));
        if (!one_row(db, stmt, true))
            continue; /* none left in this district: skipped, as TPC-C allows */
        const int64_t o = column(stmt, 0);
        finish(stmt);
        EXEC(db, DL_DELETE, order_key(w, d, o));
        stmt = QUERY(db, DL_ORDER, order_key(w, d, o));
        one_row(db, stmt, false);
        const int64_t c = column(stmt, 0);
        finish(stmt);
        EXEC(db, DL_CARRIER, order_key(w, d, o), carrier);
        EXEC(db, DL_LINES, line_key(w, d, o, 0), t->clock);
        stmt = QUERY(db, DL_AMOUNT, line_key(w, d, o, 0));
        one_row(db, stmt, false);
        const int64_t amount = column(stmt, 0);
        finish(stmt);
        EXEC(db, DL_CUSTOMER, customer_key(w, d, c), amount);
        add_result(t, o);
        add_result(t, amount);
        t->totals.delivered++;
    }
    run(db, db->stmt[COMMIT]);
    t->totals.deliveries++;
}

/* Distinct items of the district's last 20 orders whose stock is below a threshold. */
static void stock_level(struct tpcc *t, int64_t w)
{
    struct db *db = &t->db;
    const int64_t d = uniform(&t->state, 1, DISTRICTS), threshold = uniform(&t->state, 10, 20);
    run(db, db->stmt[BEGIN]);
    sqlite3_stmt *stmt = QUERY(db, SL_NEXT_ORDER, district_key(w, d));
    one_row(db, stmt, false);
    const int64_t next = column(stmt, 0);
    finish(stmt);
    stmt = QUERY(db, SL_LOW_STOCK, line_key(w, d, next > 20 ? next - 20 : 0, 0), line_key(w, d, next, 0), stock_key(w, 0),
                 threshold);
    one_row(db, stmt, false);
    add_result(t, column(stmt, 0));
    finish(stmt);
    run(db, db->stmt[COMMIT]);
    t->totals.stock_levels++;
}

__attribute__((noinline)) static void run_transactions(struct tpcc *t, uint64_t count)
{
    for (uint64_t i = 0; i < count; i++) {
        t->clock++;
        const int64_t w = uniform(&t->state, t->first_warehouse, t->first_warehouse + t->warehouses - 1);
        const uint64_t kind = wl_below(&t->state, 100);
        if (kind < NEW_ORDER_PERCENT)
            new_order(t, w);
        else if (kind < NEW_ORDER_PERCENT + PAYMENT_PERCENT)
            payment(t, w);
        else if (kind < NEW_ORDER_PERCENT + PAYMENT_PERCENT + ORDER_STATUS_PERCENT)
            order_status(t, w);
        else if (kind < NEW_ORDER_PERCENT + PAYMENT_PERCENT + ORDER_STATUS_PERCENT + DELIVERY_PERCENT)
            delivery(t, w);
        else
            stock_level(t, w);
    }
}

/* ---- the self-check --------------------------------------------------------------------------- */

/* A district's orders in the correlated subqueries below: keys after d_key's order 0, and
 * its order lines: keys after its order 0's line 0. */
#define ORDERS_OF_DISTRICT(key)                                                                          \
    " " key " > d_key << " STR(ORDER_BITS) " AND " key " < (d_key + 1) << " STR(ORDER_BITS)
#define LINES_OF_DISTRICT                                                                                \
    " ol_key > d_key << " STR(ORDER_BITS) " + " STR(LINE_BITS) " AND ol_key < (d_key + 1) << " STR(ORDER_BITS) " + " STR(LINE_BITS)
#define LINES_OF_ORDER " ol_key > o_key << " STR(LINE_BITS) " AND ol_key < (o_key + 1) << " STR(LINE_BITS)

/* TPC-C's consistency conditions (clause 3.3.2.x), each a query counting its violations. */
static const struct {
    unsigned number;
    const char *sql;
} CONDITIONS[] = {
    {1, "SELECT count(*) FROM warehouse WHERE w_ytd != (SELECT sum(d_ytd) FROM district WHERE d_w_id = w_id)"},
    {2, "SELECT count(*) FROM district WHERE d_next_o_id - 1 != (SELECT max(o_id) FROM orders WHERE"
        ORDERS_OF_DISTRICT("o_key") ") OR d_next_o_id - 1 != coalesce((SELECT max(no_o_id) FROM new_order WHERE"
        ORDERS_OF_DISTRICT("no_key") "), d_next_o_id - 1)"},
    {3, "SELECT count(*) FROM district WHERE (SELECT max(no_o_id) - min(no_o_id) + 1 - count(*) FROM new_order"
        " WHERE" ORDERS_OF_DISTRICT("no_key") ") != 0"},
    {4, "SELECT count(*) FROM district WHERE (SELECT sum(o_ol_cnt) FROM orders WHERE" ORDERS_OF_DISTRICT("o_key")
        ") != (SELECT count(*) FROM order_line WHERE" LINES_OF_DISTRICT ")"},
    {5, "SELECT count(*) FROM orders WHERE (o_carrier_id IS NULL) != EXISTS (SELECT 1 FROM new_order"
        " WHERE no_key = o_key)"},
    {6, "SELECT count(*) FROM orders WHERE o_ol_cnt != (SELECT count(*) FROM order_line WHERE" LINES_OF_ORDER ")"},
    {7, "SELECT count(*) FROM orders WHERE (SELECT count(*) FROM order_line WHERE" LINES_OF_ORDER
        " AND (ol_delivery_d IS NULL) != (o_carrier_id IS NULL)) != 0"},
    {8, "SELECT count(*) FROM warehouse LEFT JOIN (SELECT h_w_id, sum(h_amount) AS paid FROM history"
        " GROUP BY h_w_id) ON h_w_id = w_id WHERE w_ytd != coalesce(paid, 0)"},
    {9, "SELECT count(*) FROM district LEFT JOIN (SELECT h_w_id, h_d_id, sum(h_amount) AS paid FROM history"
        " GROUP BY h_w_id, h_d_id) ON h_w_id = d_w_id AND h_d_id = d_id WHERE d_ytd != coalesce(paid, 0)"},
    /* 10 and 12 together, per customer: balance = delivered - paid, balance + ytd_payment = delivered
     * (the customers, their delivered orders' amounts and their payments summed by customer key). */
    {10, "SELECT count(*) FROM (SELECT sum(balance) AS balance, sum(ytd) AS ytd, sum(delivered) AS delivered,"
         " sum(paid) AS paid FROM (SELECT c_key AS key, c_balance AS balance, c_ytd_payment AS ytd,"
         " 0 AS delivered, 0 AS paid FROM customer"
         " UNION ALL SELECT (o_key >> " STR(ORDER_BITS) ") << " STR(CUSTOMER_BITS) " | o_c_id, 0, 0,"
         " (SELECT sum(ol_amount) FROM order_line WHERE" LINES_OF_ORDER "), 0 FROM orders"
         " WHERE o_carrier_id IS NOT NULL"
         " UNION ALL SELECT (h_c_w_id << " STR(DISTRICT_BITS) " | h_c_d_id) << " STR(CUSTOMER_BITS) " | h_c_id,"
         " 0, 0, 0, h_amount FROM history) GROUP BY key)"
         " WHERE balance != delivered - paid OR balance + ytd != delivered"},
};

/* The work the run committed, as the database holds it: one row of sums and counts (a scan
 * of each table), named in TOTALS. */
static const char TOTALS_SQL[] =
    "SELECT * FROM (SELECT sum(d_next_o_id) FROM district),"
    " (SELECT count(*), count(o_carrier_id) FROM orders), (SELECT count(*) FROM order_line),"
    " (SELECT count(*) FROM new_order), (SELECT count(*) FROM history), (SELECT sum(w_ytd) FROM warehouse),"
    " (SELECT sum(c_payment_cnt), sum(c_delivery_cnt) FROM customer),"
    " (SELECT sum(s_order_cnt), sum(s_ytd), sum(s_remote_cnt) FROM stock)";
static const char *const TOTALS[] = {
    "sum(d_next_o_id)", "orders", "delivered orders", "order lines", "new orders", "history rows", "sum(w_ytd)",
    "sum(c_payment_cnt)", "sum(c_delivery_cnt)", "sum(s_order_cnt)", "sum(s_ytd)", "sum(s_remote_cnt)",
};
#define TOTALS_COLUMNS ((int)(sizeof TOTALS / sizeof TOTALS[0]))

static int64_t single_value(sqlite3 *db, const char *sql, int64_t *values, int count)
{
    sqlite3_stmt *stmt;
    if (sqlite3_prepare_v2(db, sql, -1, &stmt, NULL) != SQLITE_OK || sqlite3_step(stmt) != SQLITE_ROW ||
        sqlite3_column_count(stmt) != count)
        sqlite_fail(db, sql);
    for (int i = 0; i < count; i++)
        values[i] = sqlite3_column_int64(stmt, i);
    sqlite3_finalize(stmt);
    return values[0];
}

/* Violations of the consistency conditions and mismatches of the committed work (0: passed), in
 * the partition's database (`where` in messages: which one). */
static uint64_t check(const struct tpcc *t, const char *where)
{
    uint64_t violations = 0;
    for (size_t i = 0; i < sizeof CONDITIONS / sizeof CONDITIONS[0]; i++) {
        int64_t found;
        single_value(t->db.handle, CONDITIONS[i].sql, &found, 1);
        if (found != 0)
            fprintf(stderr, "%s: consistency condition %u%s: %" PRId64 " violations\n", wl_program.name,
                    CONDITIONS[i].number, where, found);
        violations += (uint64_t)found;
    }
    const struct totals *r = &t->totals;
    const int64_t districts = t->warehouses * DISTRICTS, customers = districts * t->customers;
    const int64_t new_orders = (int64_t)r->new_orders, delivered = (int64_t)r->delivered;
    const int64_t expected[TOTALS_COLUMNS] = {
        districts * (t->customers + 1) + new_orders,
        customers + new_orders,
        customers - districts * t->undelivered + delivered,
        t->initial_lines + (int64_t)r->order_lines,
        districts * t->undelivered + new_orders - delivered,
        customers + (int64_t)r->payments,
        customers * INITIAL_YTD_CENTS + (int64_t)r->payment_cents,
        customers + (int64_t)r->payments,
        delivered,
        (int64_t)r->order_lines,
        (int64_t)r->quantity,
        (int64_t)r->remote_lines,
    };
    int64_t found[TOTALS_COLUMNS];
    single_value(t->db.handle, TOTALS_SQL, found, TOTALS_COLUMNS);
    for (int i = 0; i < TOTALS_COLUMNS; i++)
        if (found[i] != expected[i]) {
            fprintf(stderr, "%s: committed work%s: %s is %" PRId64 " in the database, %" PRId64 " by the run\n",
                    wl_program.name, where, TOTALS[i], found[i], expected[i]);
            violations++;
        }
    return violations;
}

/* ---- the load and the check, in children ------------------------------------------------------ */

/*
 * SQLite takes ~10^4 instructions and thousands of memory accesses a row, which bound to the
 * CXL node (emulated as MMIO, ~1 us each) would cost the load and the check many minutes.
 * They run in child processes on the default (local) node instead, which hand the databases
 * (one a partition) over as images (serialized databases) in memory shared with them: only
 * what the measured process keeps, its page cache and heap, is placed by the caller. A child is this
 * program again (exec'd: a fork would keep running on pages the parent touched, its stack,
 * relocations and libraries' data), with CHILD_ENV saying its part, "load FD" or "check FD".
 */
#define CHILD_ENV "CXLSSD_TPCC_CHILD"

/* A partition's database image in the shared memory, and what the processes say about it. */
struct image {
    int64_t offset, capacity; /* where the image is, from the shared memory's start, and its room */
    int64_t bytes;            /* the image's size */
    int64_t initial_lines;    /* the load's order lines */
    struct totals totals;     /* the run's, for the check */
    uint64_t violations;      /* the check's */
};

/* The memory shared with the children (a memfd): their results and the images, one a thread. */
struct shared {
    uint64_t check_bytes; /* SQLite's heap the check took */
    struct image images[WL_MAX_THREADS];
};

/* The shared memory, from its file descriptor `fd`. */
static struct shared *map_shared(int fd)
{
    struct stat file;
    if (fstat(fd, &file) != 0 || (size_t)file.st_size <= sizeof(struct shared))
        system_fail("fstat of the shared memory");
    void *memory = mmap(NULL, (size_t)file.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (memory == MAP_FAILED)
        wl_fail("mmap of the shared memory", (uint64_t)file.st_size);
    return memory;
}

static unsigned char *image_data(struct shared *shared, const struct image *image)
{
    return (unsigned char *)shared + image->offset;
}

/*
 * The shared memory, with room for each partition's image (twice its page cache: only what is
 * written is allocated, and where it is first written, so an image a child writes is on node
 * 0); its file descriptor, inherited by the children.
 */
static int create_shared(const struct tpcc *parts, const struct options *opt, struct shared **shared)
{
    int64_t offset[WL_MAX_THREADS + 1]; /* image k: offset[k] .. offset[k + 1] */
    offset[0] = ((int64_t)sizeof(struct shared) + PAGE_BYTES - 1) / PAGE_BYTES * PAGE_BYTES;
    for (uint64_t k = 0; k < opt->threads; k++)
        offset[k + 1] = offset[k] + 2 * PAGE_BYTES *
                                        (int64_t)page_cache_pages((uint64_t)parts[k].warehouses, 1, opt->customers,
                                                                  opt->items,
                                                                  transactions_in_run(opt, parts[k].transactions));
    const int64_t bytes = offset[opt->threads];
    const int fd = memfd_create("tpcc", 0);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0)
        wl_fail("memfd for the shared memory", (uint64_t)bytes);
    *shared = map_shared(fd);
    for (uint64_t k = 0; k < opt->threads; k++)
        (*shared)->images[k] = (struct image){.offset = offset[k], .capacity = offset[k + 1] - offset[k]};
    return fd;
}

/* A database image (`bytes` of it, in `capacity` at `image`) opened where it is, memory-mapped
 * (no copy of it in a page cache); with `flags` 0 it is writable and may grow to `capacity`. */
static sqlite3 *open_image(void *image, int64_t bytes, int64_t capacity, unsigned flags)
{
    sqlite3 *db;
    if (sqlite3_open(":memory:", &db) != SQLITE_OK ||
        sqlite3_deserialize(db, "main", image, bytes, capacity, flags) != SQLITE_OK)
        sqlite_fail(db, "to open the database image");
    set_pragmas(db);
    exec_sql(db, "PRAGMA mmap_size = 1099511627776"); /* capped to SQLite's limit */
    return db;
}

/* Copy database `from` into `to`, page by page (sqlite3_backup): the same pages and B-trees. */
static void copy_database(sqlite3 *to, sqlite3 *from)
{
    sqlite3_backup *backup = sqlite3_backup_init(to, "main", from, "main");
    if (backup == NULL || sqlite3_backup_step(backup, -1) != SQLITE_DONE || sqlite3_backup_finish(backup) != SQLITE_OK)
        sqlite_fail(to, "to copy the database");
}

/* Database `db` into its shared image. */
static void save_image(sqlite3 *db, struct shared *shared, struct image *image)
{
    sqlite3 *copy = open_image(image_data(shared, image), 0, image->capacity, 0);
    copy_database(copy, db);
    int64_t pages;
    single_value(copy, "PRAGMA page_count", &pages, 1);
    image->bytes = pages * PAGE_BYTES;
    sqlite3_close(copy);
}

/* A partition's shared image, opened read-only. */
static sqlite3 *open_saved(struct shared *shared, const struct image *image)
{
    return open_image(image_data(shared, image), image->bytes, image->capacity, SQLITE_DESERIALIZE_READONLY);
}

static void db_close(struct db *db)
{
    for (int s = 0; s < STMT_COUNT; s++)
        sqlite3_finalize(db->stmt[s]);
    sqlite3_close(db->handle);
}

/* SQLite's heap in use, and its high-water mark since the last call (which resets it). */
static void heap_status(uint64_t *current, uint64_t *peak)
{
    sqlite3_int64 now, highest;
    sqlite3_status64(SQLITE_STATUS_MEMORY_USED, &now, &highest, 1);
    *current = (uint64_t)now;
    *peak = (uint64_t)highest;
}

/* Run this program's `part` in a child on the default memory policy; exit 1 if it failed. */
static void run_child(const char *part, int fd, char **argv)
{
    fflush(NULL); /* nothing buffered is written twice */
    const pid_t child = fork();
    if (child < 0)
        system_fail("fork");
    if (child == 0) {
        char value[32];
        snprintf(value, sizeof value, "%s %d", part, fd);
        if (syscall(SYS_set_mempolicy, MPOL_DEFAULT, NULL, 0) == 0 && setenv(CHILD_ENV, value, 1) == 0)
            execv("/proc/self/exe", argv);
        fprintf(stderr, "%s: cannot start the %s process: %s\n", wl_program.name, part, strerror(errno));
        _exit(1);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "%s: the %s process failed\n", wl_program.name, part);
        exit(1);
    }
}

/* The child's part: the load of every partition into its image, or the check of each one. */
static int child_main(struct tpcc *parts, const struct options *opt, const char *part)
{
    char role[8];
    int fd;
    if (sscanf(part, "%7s %d", role, &fd) != 2) {
        fprintf(stderr, "%s: %s='%s' is not a part\n", wl_program.name, CHILD_ENV, part);
        return 1;
    }
    struct shared *shared = map_shared(fd);
    if (strcmp(role, "load") == 0) {
        configure_sqlite(1, NULL, 0, 0); /* the check child keeps SQLite's default (serialized) mode */
        uint64_t state = 0; /* set by the first partition's load, continued by the next ones */
        for (uint64_t k = 0; k < opt->threads; k++) {
            struct tpcc *t = &parts[k];
            db_open(&t->db);
            exec_sql(t->db.handle, SCHEMA);
            db_prepare(&t->db);
            load(t, &state);
            save_image(t->db.handle, shared, &shared->images[k]);
            shared->images[k].initial_lines = t->initial_lines;
            db_close(&t->db);
        }
        return 0;
    }
    uint64_t start, peak;
    heap_status(&start, &peak);
    for (uint64_t k = 0; k < opt->threads; k++) {
        struct tpcc *t = &parts[k];
        struct image *image = &shared->images[k];
        t->db.handle = open_saved(shared, image);
        t->initial_lines = image->initial_lines;
        t->totals = image->totals;
        char where[64] = ""; /* with threads, the partition a message is about */
        if (opt->threads > 1)
            snprintf(where, sizeof where, " in warehouses %" PRId64 "..%" PRId64, t->first_warehouse,
                     t->first_warehouse + t->warehouses - 1);
        image->violations = check(t, where);
        sqlite3_close(t->db.handle);
    }
    heap_status(&peak, &peak);
    shared->check_bytes = peak - start;
    return 0;
}

/* ---- main --------------------------------------------------------------------------------- */

/*
 * Thread k's benchmark (the same in the children: from the same options): its partition, a
 * contiguous share of the warehouses, and its share of the transactions; the parameters and
 * NURand's constants (every thread's the same); its generator, thread 0's continuing after the
 * constants as the one thread's does.
 */
static struct tpcc tpcc_make(const struct options *opt, uint64_t k)
{
    const uint64_t share = opt->warehouses / opt->threads, extra = opt->warehouses % opt->threads;
    struct tpcc t = {.first_warehouse = (int64_t)(1 + k * share + (k < extra ? k : extra)),
                     .warehouses = (int64_t)(share + (k < extra)),
                     .transactions = opt->transactions / opt->threads + (k < opt->transactions % opt->threads),
                     .customers = (int64_t)opt->customers, .items = (int64_t)opt->items, .seed = opt->common.seed,
                     .state = wl_stream(opt->common.seed, STREAM_RUN)};
    t.names = t.customers / 3 < 1000 ? t.customers / 3 : 1000;
    t.undelivered = t.customers * UNDELIVERED_PERCENT / 100;
    /* NURand's constants; the last names' run constant differs from the load's as clause 2.1.6.1 asks. */
    t.c_last_load = uniform(&t.state, 0, 255);
    int64_t delta;
    do {
        t.c_last_run = uniform(&t.state, 0, 255);
        delta = llabs(t.c_last_run - t.c_last_load);
    } while (delta < 65 || delta > 119 || delta == 96 || delta == 112);
    t.c_id = uniform(&t.state, 0, 1023);
    t.ol_i_id = uniform(&t.state, 0, 8191);
    if (k > 0)
        t.state = wl_stream(opt->common.seed, STREAM_RUN + k);
    return t;
}

static void run_thread(uint64_t k, void *shared)
{
    struct tpcc *parts = shared;
    run_transactions(&parts[k], parts[k].transactions);
}

static void add_totals(struct totals *sum, const struct totals *r)
{
    sum->new_orders += r->new_orders;
    sum->rollbacks += r->rollbacks;
    sum->payments += r->payments;
    sum->order_status += r->order_status;
    sum->deliveries += r->deliveries;
    sum->stock_levels += r->stock_levels;
    sum->order_lines += r->order_lines;
    sum->quantity += r->quantity;
    sum->remote_lines += r->remote_lines;
    sum->delivered += r->delivered;
    sum->payment_cents += r->payment_cents;
}

int main(int argc, char **argv)
{
    wl_start("tpcc", USAGE);
    const struct options opt = parse_options(argc, argv);
    static struct tpcc parts[WL_MAX_THREADS]; /* a thread's each */
    for (uint64_t k = 0; k < opt.threads; k++)
        parts[k] = tpcc_make(&opt, k);
    const char *part = getenv(CHILD_ENV);
    if (part != NULL)
        return child_main(parts, &opt, part);

    /* The page cache, every partition's: at most ~2^28 pages within the options' limits, an int for SQLite. */
    const uint64_t pages =
        page_cache_pages(opt.warehouses, opt.threads, opt.customers, opt.items,
                         transactions_in_run(&opt, opt.transactions));
    struct shared *shared;
    const int fd = create_shared(parts, &opt, &shared);
    run_child("load", fd, argv);
    for (uint64_t k = 0; k < opt.threads; k++) {
        parts[k].initial_lines = shared->images[k].initial_lines;
        parts[k].by_name = wl_alloc((uint64_t)parts[k].customers * sizeof *parts[k].by_name);
    }
    void *page_cache = wl_alloc(pages * opt.slot_bytes);
    configure_sqlite(opt.threads, page_cache, (int)opt.slot_bytes, (int)pages);
    for (uint64_t k = 0; k < opt.threads; k++) {
        db_open(&parts[k].db);
        sqlite3 *image = open_saved(shared, &shared->images[k]);
        copy_database(parts[k].db.handle, image);
        sqlite3_close(image);
        db_prepare(&parts[k].db);
    }
    uint64_t heap, heap_peak;
    heap_status(&heap, &heap_peak);
    wl_count_alloc(heap);

    for (uint64_t pass = 0; pass <= opt.warm_passes; pass++) {
        const struct wl_common *roi = pass == opt.warm_passes ? &opt.common : NULL;
        if (opt.threads > 1) {
            wl_run_threads(opt.threads, run_thread, parts, NULL, roi);
        } else {
            wl_roi_begin(roi);
            run_transactions(&parts[0], opt.transactions);
        }
    }
    wl_roi_end(&opt.common, &parts[0].totals.payment_cents, sizeof parts[0].totals.payment_cents);

    heap_status(&heap, &heap_peak);
    sqlite3_int64 overflow, unused;
    sqlite3_status64(SQLITE_STATUS_PAGECACHE_OVERFLOW, &overflow, &unused, 0);
    int64_t page_count = 0;
    struct totals totals = {0};
    uint64_t checksum = parts[0].hash; /* with threads, their hashes combined in thread order */
    for (uint64_t k = 0; k < opt.threads; k++) {
        int64_t db_pages;
        single_value(parts[k].db.handle, "PRAGMA page_count", &db_pages, 1);
        page_count += db_pages;
        save_image(parts[k].db.handle, shared, &shared->images[k]);
        shared->images[k].totals = parts[k].totals;
        add_totals(&totals, &parts[k].totals);
        if (k > 0)
            checksum = wl_hash(checksum, parts[k].hash);
    }
    run_child("check", fd, argv);
    uint64_t violations = 0;
    for (uint64_t k = 0; k < opt.threads; k++)
        violations += shared->images[k].violations;
    wl_count_alloc(shared->check_bytes);

    struct wl_json j = wl_report_begin();
    wl_json_u64(&j, "warehouses", opt.warehouses);
    wl_json_u64(&j, "customers", opt.customers);
    wl_json_u64(&j, "items", opt.items);
    wl_json_u64(&j, "transactions", opt.transactions);
    wl_json_u64(&j, "threads", opt.threads);
    wl_json_u64(&j, "warm_passes", opt.warm_passes);
    wl_report_data(&j, &opt.common);
    const struct totals *r = &totals;
    wl_json_u64(&j, "new_order", r->new_orders + r->rollbacks);
    wl_json_u64(&j, "payment", r->payments);
    wl_json_u64(&j, "order_status", r->order_status);
    wl_json_u64(&j, "delivery", r->deliveries);
    wl_json_u64(&j, "stock_level", r->stock_levels);
    wl_json_u64(&j, "rollbacks", r->rollbacks);
    wl_json_u64(&j, "order_lines", r->order_lines);
    wl_json_u64(&j, "delivered_orders", r->delivered);
    wl_json_u64(&j, "db_bytes", (uint64_t)page_count * PAGE_BYTES);
    wl_json_u64(&j, "page_cache_bytes", pages * opt.slot_bytes);
    wl_json_u64(&j, "heap_peak_bytes", heap_peak);
    wl_json_u64(&j, "page_cache_overflow_bytes", (uint64_t)overflow);
    wl_json_u64(&j, "violations", violations);
    wl_json_str(&j, "sqlite_version", sqlite3_libversion());
    return wl_report_end(&j, violations == 0, checksum);
}
