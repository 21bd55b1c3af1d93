/*
 * Integer columns of one SQLite query, straight into Arrow-layout buffers.
 *
 * Why this exists: a 10 M-kernel nsys export is read in a few integer columns, and every
 * general-purpose reader pays a fixed cost per value on top of SQLite's own (measured on the
 * 10 M-kernel benchmark file, six integer columns: SQLite alone 2.4 s, connectorx 4.2 s,
 * ADBC 4.8 s). This loop calls sqlite3_column_type/int64 and stores the value, nothing more.
 *
 * scan(uri, sql, setup, limits, kinds) -> (names, columns, rows)
 *   uri     a SQLite "file:" URI, opened read-only (SQLITE_OPEN_READONLY, whatever the URI says)
 *   sql     one SELECT; every column is read as a 64-bit integer, with SQLite's CAST rules for a
 *           non-integer value (as CAST(x AS INTEGER) gives it), NULL kept as null
 *   setup   statements run first (the hardening pragmas)
 *   limits  (category, value) pairs for sqlite3_limit
 *   kinds   one letter per column: 'i' (the default for a column past its end) a 64-bit integer
 *           as above; 't' text (sqlite3_column_text: a number as its text), 'b' bytes
 *           (sqlite3_column_blob); text is not checked for UTF-8 here
 *   names   the result's column names
 *   columns per column (data, validity): data is rows little-endian int64 values; validity is
 *           None when the column has no null, otherwise an Arrow validity bitmap (bit set = value);
 *           a 't' or 'b' column (offsets, data, validity): rows + 1 int64 offsets into data (Arrow's
 *           large binary layout), a null as an empty value with its validity bit clear
 *   rows    the row count
 * table(path, root, columns, names, ranges, filter_column, filter_values) -> (names, columns, rows) | None
 *   The same result for a plain read of integer columns of one rowid table, without SQLite: the
 *   table's b-tree is walked from its root page and each record decoded here (a 10 M-kernel export:
 *   0.7 s for the kernels' six columns against SQLite's 2.2 s; SQLite's per-row cost is its virtual
 *   machine, not the file). columns: each wanted column's index in the record, -1 for the rowid;
 *   ranges: flat (lo, hi) rowid bounds [lo, hi), sorted and disjoint, or None for every row;
 *   filter_column (-1: none): only rows whose that column is one of filter_values (sorted ints);
 *   kinds (optional, one letter per column, as scan()'s plus 'n'): 'i' an integer as it is, 't'
 *   or 'b' the bytes of a text or blob as IFNULL(CAST(x AS TEXT|BLOB), '') gives them (never
 *   null), 'n' 1 where the value is NULL, else 0 (the ``x IS NULL`` flag the nsys reader reads).
 *   skip_column, skip_prefix, count_column (optional): rows (of those filtered in) whose
 *   skip_column is a text starting with the bytes skip_prefix are not stored but counted per value
 *   of count_column (an integer column; -1: all together); the result then has a fourth item,
 *   [(value | None for NULL, rows skipped)] in first-seen order. The nsys reader folds PyTorch's
 *   per-op ``aten::`` NVTX ranges so: 48 M of them never become strings. More than 4096 distinct
 *   values to count, or a prefix on an overflow page, gives None as well.
 *   None whenever the file holds anything this reader does not take exactly as SQLite would: a
 *   value needed that lies on an overflow page, a value that is not an integer or NULL in an integer
 *   column read or filtered, a number in a text or blob column, text not stored as UTF-8, a page
 *   that is not a table b-tree page, rowids out of order, a tree deeper than 20 or
 *   visiting more pages than the file has (a damaged or hostile file: every offset and varint is
 *   bounds-checked against its page). The caller then reads the same rows through SQLite. A record
 *   shorter than a wanted column gives NULL there (the caller only asks for columns without a
 *   default). The file is read with pread, in 1 MB blocks once pages come in file order; the GIL
 *   is released meanwhile.
 *
 * seek(fd, root, at, column) -> (rowid, value | None) | None | False
 *   The first row of the rowid table at root page ``root`` whose rowid is ``at`` or later, as
 *   ``SELECT rowid, CAST(col AS INTEGER) ... WHERE rowid >= at ORDER BY rowid LIMIT 1`` gives it:
 *   the b-tree walked down from the root, one aligned pread a page (fd: the file, opened read-only
 *   by the caller; the GIL is kept: see seek()). column: the value's position in the record; a
 *   record that ends before it gives None there. None: no such row. False wherever SQLite would
 *   convert the value (a real, text or blob), the value lies on an overflow page, or the file is
 *   not what a table b-tree holds (every offset and varint bounds-checked, pages visited at most
 *   the file's count): the caller asks SQLite. A sliced read bisects each block's end with these.
 *
 * split_ids(global_ids, pid, tid) -> None
 *   nsys's global thread (or process) ids split as SQLite computes them, (g >> 24) & 0xFFFFFF
 *   and g & 0xFFFFFF, in one pass: global_ids int64 (n); pid writable int32 or int64 (n); tid
 *   writable int32 (n) or None. The Polars expressions made four or five arrays of n values for
 *   the two (a runtime table of 20 M calls: 0.5 GB of fresh memory, read twice).
 *
 * The connection reads through a read-ahead shim of the default VFS ("traceguard-ahead", below):
 * in-order page reads are served from 256 kB blocks, one pread each instead of one per page.
 * The buffers are read-only objects exporting the buffer protocol (pyarrow.py_buffer takes them
 * without a copy). The GIL is released while SQLite runs. Errors raise scan.Error with SQLite's
 * message; out of memory raises MemoryError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define MAX_COLUMNS 64
#define FIRST_ROWS 65536
/* A rowid-ranged table() read that neither filters nor skips rows starts its columns at the
   ranges' size (the rows it reads), up to this many rows, instead of doubling from FIRST_ROWS:
   each doubling under glibc's mmap threshold copied the column into fresh pages (scan_grow).
   Pages never written are never touched, and result_of gives back what the read did not fill. */
#define HINT_ROWS_MAX ((Py_ssize_t)1 << 22)

static PyObject *ScanError;
/* Whether the read-ahead VFS below is registered (else the default VFS reads). */
static int ahead_ready = 0;

/* ---- a malloc'd block exported through the buffer protocol ---------------------------------- */

typedef struct {
    PyObject_HEAD
    void *data;
    Py_ssize_t size;
} Block;

static void block_dealloc(Block *self) {
    free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int block_getbuffer(Block *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 1, flags);
}

static PyBufferProcs block_as_buffer = {(getbufferproc)block_getbuffer, NULL};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traceguard.ingest._int_scan.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = (destructor)block_dealloc,
    .tp_as_buffer = &block_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A read-only block of memory filled by scan().",
};

/* Takes ownership of data (freed here on failure). */
static PyObject *block_new(void *data, Py_ssize_t size) {
    Block *block = PyObject_New(Block, &BlockType);
    if (block == NULL) {
        free(data);
        return NULL;
    }
    block->data = data;
    block->size = size;
    return (PyObject *)block;
}

/* ---- read-ahead for sequential scans (a VFS shim over the default one) ---------------------- */

/* A buffer the file is pread into, aligned to a page. The kernel copies into a destination
   that is not 64-byte aligned at a fraction of the speed (this AMD EPYC VM: 2 GB from the page
   cache in 1.2-1.3 s into a block at 16 bytes past a line, 0.25-0.3 s into an aligned one), and
   malloc's alignment of a large block is whatever its arena gives (the per-op NVTX table, 48 M
   rows: 2.8-3.3 s of system time against 0.6-0.7 s). */
static void *aligned_block(size_t size) {
    void *p = NULL;
    return posix_memalign(&p, 4096, size) == 0 ? p : NULL;
}

/* SQLite reads a table scan one 4 kB page per pread; on a VM each pread costs a few µs of system
   time (a 10 M-kernel export: 430 k pages, about a third of the read's CPU). This shim serves a
   file's reads from a block it reads ahead once the reads have run in order for a few pages, and
   reads straight through otherwise (a b-tree probe is not made to read a whole block). The files
   are opened read-only and only by this module's connections, so a block cannot go stale while
   the statement that read it runs; everything but xRead is the default VFS's. */

#define AHEAD_BYTES (256 * 1024)
#define AHEAD_AFTER 4 /* in-order reads before reading ahead */

typedef struct {
    sqlite3_file base;     /* pMethods: ahead_methods, or NULL when the real open failed */
    sqlite3_file *real;    /* the default VFS's file, right after this struct */
    char *block;           /* AHEAD_BYTES read at block_at, block_len of them valid */
    sqlite3_int64 block_at;
    sqlite3_int64 block_len;
    sqlite3_int64 next;    /* where the last read ended */
    int in_order;          /* reads in a row that started where the previous one ended */
} AheadFile;

static sqlite3_vfs ahead_vfs;
static sqlite3_io_methods ahead_methods;

static int ahead_close(sqlite3_file *f) {
    AheadFile *p = (AheadFile *)f;
    int rc = p->real->pMethods ? p->real->pMethods->xClose(p->real) : SQLITE_OK;
    free(p->block);
    p->block = NULL;
    return rc;
}

static int ahead_read(sqlite3_file *f, void *out, int amount, sqlite3_int64 offset) {
    AheadFile *p = (AheadFile *)f;
    p->in_order = offset == p->next ? p->in_order + 1 : 0;
    p->next = offset + amount;
    if (p->block != NULL && offset >= p->block_at && offset + amount <= p->block_at + p->block_len) {
        memcpy(out, p->block + (offset - p->block_at), (size_t)amount);
        return SQLITE_OK;
    }
    if (p->in_order < AHEAD_AFTER || amount > AHEAD_BYTES / 4) {
        return p->real->pMethods->xRead(p->real, out, amount, offset);
    }
    sqlite3_int64 size = 0;
    if (p->block == NULL) p->block = aligned_block(AHEAD_BYTES);
    if (p->block == NULL || p->real->pMethods->xFileSize(p->real, &size) != SQLITE_OK || offset >= size) {
        return p->real->pMethods->xRead(p->real, out, amount, offset);
    }
    sqlite3_int64 want = size - offset < AHEAD_BYTES ? size - offset : AHEAD_BYTES;
    int rc = p->real->pMethods->xRead(p->real, p->block, (int)want, offset);
    if (rc != SQLITE_OK) { /* a short read (the file shrank) or an error: the plain read says which */
        p->block_len = 0;
        return p->real->pMethods->xRead(p->real, out, amount, offset);
    }
    p->block_at = offset;
    p->block_len = want;
    if (offset + amount > p->block_at + p->block_len) return p->real->pMethods->xRead(p->real, out, amount, offset);
    memcpy(out, p->block, (size_t)amount);
    return SQLITE_OK;
}

static int ahead_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o) {
    AheadFile *p = (AheadFile *)f;
    p->block_len = 0;
    return p->real->pMethods->xWrite(p->real, b, n, o);
}
static int ahead_truncate(sqlite3_file *f, sqlite3_int64 size) {
    AheadFile *p = (AheadFile *)f;
    p->block_len = 0;
    return p->real->pMethods->xTruncate(p->real, size);
}
static int ahead_sync(sqlite3_file *f, int flags) { return ((AheadFile *)f)->real->pMethods->xSync(((AheadFile *)f)->real, flags); }
static int ahead_file_size(sqlite3_file *f, sqlite3_int64 *size) {
    return ((AheadFile *)f)->real->pMethods->xFileSize(((AheadFile *)f)->real, size);
}
static int ahead_lock(sqlite3_file *f, int level) { return ((AheadFile *)f)->real->pMethods->xLock(((AheadFile *)f)->real, level); }
static int ahead_unlock(sqlite3_file *f, int level) {
    AheadFile *p = (AheadFile *)f;
    p->block_len = 0; /* once unlocked, another process may change the file */
    return p->real->pMethods->xUnlock(p->real, level);
}
static int ahead_check_lock(sqlite3_file *f, int *out) {
    return ((AheadFile *)f)->real->pMethods->xCheckReservedLock(((AheadFile *)f)->real, out);
}
static int ahead_control(sqlite3_file *f, int op, void *arg) {
    return ((AheadFile *)f)->real->pMethods->xFileControl(((AheadFile *)f)->real, op, arg);
}
static int ahead_sector(sqlite3_file *f) { return ((AheadFile *)f)->real->pMethods->xSectorSize(((AheadFile *)f)->real); }
static int ahead_device(sqlite3_file *f) {
    return ((AheadFile *)f)->real->pMethods->xDeviceCharacteristics(((AheadFile *)f)->real);
}
static int ahead_shm_map(sqlite3_file *f, int region, int size, int extend, void volatile **out) {
    return ((AheadFile *)f)->real->pMethods->xShmMap(((AheadFile *)f)->real, region, size, extend, out);
}
static int ahead_shm_lock(sqlite3_file *f, int offset, int n, int flags) {
    return ((AheadFile *)f)->real->pMethods->xShmLock(((AheadFile *)f)->real, offset, n, flags);
}
static void ahead_shm_barrier(sqlite3_file *f) { ((AheadFile *)f)->real->pMethods->xShmBarrier(((AheadFile *)f)->real); }
static int ahead_shm_unmap(sqlite3_file *f, int remove) {
    return ((AheadFile *)f)->real->pMethods->xShmUnmap(((AheadFile *)f)->real, remove);
}

static int ahead_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags) {
    sqlite3_vfs *real_vfs = (sqlite3_vfs *)vfs->pAppData;
    AheadFile *p = (AheadFile *)f;
    memset(p, 0, sizeof(*p));
    p->real = (sqlite3_file *)&p[1];
    int rc = real_vfs->xOpen(real_vfs, name, p->real, flags, out_flags);
    /* Every method the real file has; none (so xClose is not called) when its open failed. */
    p->base.pMethods = p->real->pMethods ? &ahead_methods : NULL;
    return rc;
}

/* Registered once (not as the default): the connections of scan() name it. 0 on success. */
static int ahead_register(void) {
    sqlite3_vfs *real_vfs = sqlite3_vfs_find(NULL);
    if (real_vfs == NULL) return -1;
    ahead_vfs = *real_vfs; /* every VFS call but xOpen is the real one's */
    ahead_vfs.zName = "traceguard-ahead";
    ahead_vfs.szOsFile = (int)sizeof(AheadFile) + real_vfs->szOsFile;
    ahead_vfs.pAppData = real_vfs;
    ahead_vfs.xOpen = ahead_open;
    ahead_vfs.pNext = NULL;
    ahead_methods = (sqlite3_io_methods){
        2, ahead_close, ahead_read, ahead_write, ahead_truncate, ahead_sync, ahead_file_size, ahead_lock,
        ahead_unlock, ahead_check_lock, ahead_control, ahead_sector, ahead_device, ahead_shm_map,
        ahead_shm_lock, ahead_shm_barrier, ahead_shm_unmap, NULL, NULL,
    };
    return sqlite3_vfs_register(&ahead_vfs, 0) == SQLITE_OK ? 0 : -1;
}

/* ---- the scan (no Python API in here: it runs without the GIL) ------------------------------ */

typedef struct {
    int64_t *values[MAX_COLUMNS]; /* a 't'/'b' column: its rows + 1 offsets, values[i][0] = 0 */
    char kinds[MAX_COLUMNS];
    char *bytes[MAX_COLUMNS]; /* a 't'/'b' column's data */
    size_t bytes_used[MAX_COLUMNS];
    size_t bytes_capacity[MAX_COLUMNS];
    uint8_t *validity[MAX_COLUMNS]; /* NULL until the column's first null */
    int columns;
    Py_ssize_t rows;
    Py_ssize_t capacity;
    Py_ssize_t first_capacity; /* rows the first allocation holds (0: FIRST_ROWS); a multiple of 8 */
    int out_of_memory;
    char *error; /* malloc'd message */
} Scan;

static void scan_free(Scan *s) {
    for (int i = 0; i < s->columns; i++) {
        free(s->values[i]);
        free(s->validity[i]);
        free(s->bytes[i]);
        s->values[i] = NULL;
        s->validity[i] = NULL;
        s->bytes[i] = NULL;
    }
    free(s->error);
    s->error = NULL;
}

static void scan_fail(Scan *s, sqlite3 *db, const char *what) {
    const char *message = db ? sqlite3_errmsg(db) : "cannot allocate a SQLite connection";
    size_t length = strlen(what) + strlen(message) + 3;
    s->error = malloc(length);
    if (s->error != NULL) {
        snprintf(s->error, length, "%s: %s", what, message);
    } else {
        s->out_of_memory = 1;
    }
}

static int scan_grow(Scan *s) {
    Py_ssize_t capacity = s->capacity ? s->capacity * 2 : s->first_capacity > 0 ? s->first_capacity : FIRST_ROWS;
    for (int i = 0; i < s->columns; i++) {
        int offsets = s->kinds[i] != 'i';
        int64_t *values = realloc(s->values[i], (size_t)(capacity + offsets) * sizeof(int64_t));
        if (values == NULL) return -1;
        if (offsets && s->values[i] == NULL) values[0] = 0;
        s->values[i] = values;
        if (s->validity[i] != NULL) {
            uint8_t *bits = realloc(s->validity[i], (size_t)capacity / 8);
            if (bits == NULL) return -1;
            /* New rows start valid; a null clears its bit. */
            memset(bits + s->capacity / 8, 0xFF, (size_t)(capacity - s->capacity) / 8);
            s->validity[i] = bits;
        }
    }
    s->capacity = capacity;
    return 0;
}

/* At column i's first null: every row so far (and every later one, until a null) is valid. */
static int scan_start_validity(Scan *s, int i) {
    uint8_t *bits = malloc((size_t)s->capacity / 8);
    if (bits == NULL) return -1;
    memset(bits, 0xFF, (size_t)s->capacity / 8);
    s->validity[i] = bits;
    return 0;
}

/* Row r of 't'/'b' column i: n bytes at data appended, its end offset stored. */
static int scan_append(Scan *s, int i, Py_ssize_t r, const void *data, size_t n) {
    int64_t *offsets = s->values[i];
    if (s->bytes_used[i] + n > s->bytes_capacity[i]) {
        size_t capacity = s->bytes_capacity[i] ? s->bytes_capacity[i] : (size_t)1 << 20;
        while (capacity < s->bytes_used[i] + n) capacity *= 2;
        char *grown = realloc(s->bytes[i], capacity);
        if (grown == NULL) return -1;
        s->bytes[i] = grown;
        s->bytes_capacity[i] = capacity;
    }
    if (n) memcpy(s->bytes[i] + s->bytes_used[i], data, n);
    s->bytes_used[i] += n;
    offsets[r + 1] = (int64_t)s->bytes_used[i];
    return 0;
}

/* Row r of 't'/'b' column i: its bytes appended to the column's data, its end offset stored. */
static int scan_bytes(Scan *s, sqlite3_stmt *stmt, int i, Py_ssize_t r) {
    int64_t *offsets = s->values[i];
    if (sqlite3_column_type(stmt, i) == SQLITE_NULL) {
        if (s->validity[i] == NULL && scan_start_validity(s, i) != 0) return -1;
        s->validity[i][r >> 3] &= (uint8_t) ~(1u << (r & 7));
        offsets[r + 1] = offsets[r];
        return 0;
    }
    /* The pointer first, then its length (SQLite's documented order: the call that converts). */
    const void *data = s->kinds[i] == 't' ? (const void *)sqlite3_column_text(stmt, i) : sqlite3_column_blob(stmt, i);
    size_t n = (size_t)sqlite3_column_bytes(stmt, i);
    if (data == NULL && n > 0) return -1; /* SQLite ran out of memory converting the value */
    return scan_append(s, i, r, data, n);
}

static void scan_run(Scan *s, const char *uri, const char *sql, const char **setup, Py_ssize_t n_setup,
                     const int *limit_ids, const int *limit_values, Py_ssize_t n_limits, char **names) {
    sqlite3 *db = NULL;
    sqlite3_stmt *stmt = NULL;
    /* NOMUTEX: this connection is used by this thread only, so SQLite need not lock per call. */
    int flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(uri, &db, flags, ahead_ready ? "traceguard-ahead" : NULL) != SQLITE_OK) {
        scan_fail(s, db, "cannot open the database");
        goto done;
    }
    sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, (int *)NULL);
    for (Py_ssize_t i = 0; i < n_limits; i++) sqlite3_limit(db, limit_ids[i], limit_values[i]);
    for (Py_ssize_t i = 0; i < n_setup; i++) {
        if (sqlite3_exec(db, setup[i], NULL, NULL, NULL) != SQLITE_OK) {
            scan_fail(s, db, "cannot prepare the connection");
            goto done;
        }
    }
    if (sqlite3_prepare_v2(db, sql, -1, &stmt, NULL) != SQLITE_OK) {
        scan_fail(s, db, "cannot prepare the query");
        goto done;
    }
    if (!sqlite3_stmt_readonly(stmt)) {
        s->error = strdup("the query would write to the database");
        if (s->error == NULL) s->out_of_memory = 1;
        goto done;
    }
    int columns = sqlite3_column_count(stmt);
    if (columns < 1 || columns > MAX_COLUMNS) {
        s->error = strdup("the query must return between 1 and 64 columns");
        if (s->error == NULL) s->out_of_memory = 1;
        goto done;
    }
    s->columns = columns;
    for (int i = 0; i < columns; i++) {
        const char *name = sqlite3_column_name(stmt, i);
        names[i] = strdup(name ? name : "");
        if (names[i] == NULL) {
            s->out_of_memory = 1;
            goto done;
        }
    }
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        Py_ssize_t r = s->rows;
        if (r == s->capacity && scan_grow(s) != 0) {
            s->out_of_memory = 1;
            goto done;
        }
        for (int i = 0; i < columns; i++) {
            if (s->kinds[i] != 'i') {
                if (scan_bytes(s, stmt, i, r) != 0) {
                    s->out_of_memory = 1;
                    goto done;
                }
                continue;
            }
            /* One column call per value: sqlite3_column_type + sqlite3_column_int64 would be two,
               each with its own bookkeeping (about 20% of the whole read). */
            sqlite3_value *value = sqlite3_column_value(stmt, i);
            if (sqlite3_value_type(value) == SQLITE_NULL) {
                if (s->validity[i] == NULL && scan_start_validity(s, i) != 0) {
                    s->out_of_memory = 1;
                    goto done;
                }
                s->validity[i][r >> 3] &= (uint8_t) ~(1u << (r & 7));
                s->values[i][r] = 0;
            } else {
                s->values[i][r] = sqlite3_value_int64(value);
            }
        }
        s->rows = r + 1;
    }
    if (rc != SQLITE_DONE) scan_fail(s, db, "cannot read the query's rows");
done:
    sqlite3_finalize(stmt);
    sqlite3_close(db);
}

/* ---- the Python function -------------------------------------------------------------------- */

/* UTF-8 pointers into the str objects of *keep (a new reference the caller releases after use). */
static int string_list(PyObject *sequence, const char ***out, Py_ssize_t *count, PyObject **keep) {
    PyObject *fast = PySequence_Fast(sequence, "setup must be a sequence of str");
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    const char **items = PyMem_Calloc(n ? (size_t)n : 1, sizeof(char *));
    if (items == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        items[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
        if (items[i] == NULL) {
            PyMem_Free(items);
            Py_DECREF(fast);
            return -1;
        }
    }
    *out = items;
    *count = n;
    *keep = fast;
    return 0;
}

/* Column i's validity as a block (its bitmap passes to it), or a new reference to None when the
   column had no null; NULL with an exception set on failure. */
static PyObject *validity_block(Scan *s, int i) {
    if (s->validity[i] == NULL) {
        Py_INCREF(Py_None);
        return Py_None;
    }
    PyObject *block = block_new(s->validity[i], (Py_ssize_t)((s->rows + 7) / 8));
    s->validity[i] = NULL;
    return block;
}

/* A 't'/'b' column as (offsets, data, validity | None); the buffers pass to the blocks. */
static PyObject *bytes_column(Scan *s, int i) {
    int64_t *offsets = s->values[i];
    if (offsets == NULL) { /* no rows */
        offsets = calloc(1, sizeof(int64_t));
        if (offsets == NULL) return PyErr_NoMemory();
    }
    s->values[i] = NULL;
    if (s->rows < s->capacity) { /* what the read did not fill (a hinted capacity: HINT_ROWS_MAX) */
        int64_t *shrunk = realloc(offsets, (size_t)(s->rows + 1) * sizeof(int64_t));
        if (shrunk != NULL) offsets = shrunk;
    }
    PyObject *offsets_block = block_new(offsets, (Py_ssize_t)((size_t)(s->rows + 1) * sizeof(int64_t)));
    if (offsets_block == NULL) return NULL;
    char *data = s->bytes[i];
    if (data == NULL) data = malloc(1); /* no bytes: still a real pointer */
    else if (s->bytes_used[i] && s->bytes_used[i] < s->bytes_capacity[i]) {
        char *shrunk = realloc(data, s->bytes_used[i]);
        if (shrunk != NULL) data = shrunk;
    }
    s->bytes[i] = NULL;
    if (data == NULL) {
        Py_DECREF(offsets_block);
        return PyErr_NoMemory();
    }
    PyObject *data_block = block_new(data, (Py_ssize_t)s->bytes_used[i]);
    if (data_block == NULL) {
        Py_DECREF(offsets_block);
        return NULL;
    }
    PyObject *validity = validity_block(s, i);
    if (validity == NULL) {
        Py_DECREF(offsets_block);
        Py_DECREF(data_block);
        return NULL;
    }
    PyObject *triple = PyTuple_Pack(3, offsets_block, data_block, validity);
    Py_DECREF(offsets_block);
    Py_DECREF(data_block);
    Py_DECREF(validity);
    return triple;
}

static PyObject *result_of(Scan *s, char **names) {
    PyObject *name_list = PyList_New(s->columns);
    PyObject *column_list = PyList_New(s->columns);
    if (name_list == NULL || column_list == NULL) goto fail;
    for (int i = 0; i < s->columns; i++) {
        PyObject *name = PyUnicode_DecodeUTF8(names[i], (Py_ssize_t)strlen(names[i]), "replace");
        if (name == NULL) goto fail;
        PyList_SET_ITEM(name_list, i, name);
    }
    for (int i = 0; i < s->columns; i++) {
        if (s->kinds[i] != 'i') {
            PyObject *column = bytes_column(s, i);
            if (column == NULL) goto fail;
            PyList_SET_ITEM(column_list, i, column);
            continue;
        }
        /* Give back what the doubling over-allocated (realloc shrinks in place). */
        size_t bytes = (size_t)s->rows * sizeof(int64_t);
        int64_t *values = s->values[i];
        if (values == NULL) values = malloc(sizeof(int64_t)); /* no rows: still a real pointer */
        if (values == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        if (s->rows < s->capacity) {
            int64_t *shrunk = realloc(values, bytes ? bytes : sizeof(int64_t));
            if (shrunk != NULL) values = shrunk;
        }
        s->values[i] = NULL;
        PyObject *data = block_new(values, (Py_ssize_t)bytes);
        if (data == NULL) goto fail;
        PyObject *validity = validity_block(s, i);
        if (validity == NULL) {
            Py_DECREF(data);
            goto fail;
        }
        PyObject *pair = PyTuple_Pack(2, data, validity);
        Py_DECREF(data);
        Py_DECREF(validity);
        if (pair == NULL) goto fail;
        PyList_SET_ITEM(column_list, i, pair);
    }
    PyObject *result = Py_BuildValue("(NNn)", name_list, column_list, s->rows);
    return result;
fail:
    Py_XDECREF(name_list);
    Py_XDECREF(column_list);
    return NULL;
}

static PyObject *scan(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"uri", "sql", "setup", "limits", "kinds", NULL};
    const char *uri;
    const char *sql;
    PyObject *setup_arg = NULL;
    PyObject *limits_arg = NULL;
    const char *kinds = "";
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ss|OOs:scan", keywords, &uri, &sql, &setup_arg, &limits_arg,
                                     &kinds))
        return NULL;
    size_t n_kinds = strlen(kinds);
    if (n_kinds > MAX_COLUMNS || strspn(kinds, "itb") != n_kinds) {
        PyErr_SetString(PyExc_ValueError, "kinds: at most 64 of 'i', 't', 'b'");
        return NULL;
    }

    const char **setup = NULL;
    Py_ssize_t n_setup = 0;
    PyObject *setup_strings = NULL;
    if (setup_arg != NULL && string_list(setup_arg, &setup, &n_setup, &setup_strings) != 0) return NULL;

    int *limit_ids = NULL;
    int *limit_values = NULL;
    Py_ssize_t n_limits = 0;
    if (limits_arg != NULL) {
        PyObject *fast = PySequence_Fast(limits_arg, "limits must be a sequence of (category, value) pairs");
        if (fast == NULL) goto fail_args;
        n_limits = PySequence_Fast_GET_SIZE(fast);
        limit_ids = PyMem_Calloc(n_limits ? (size_t)n_limits : 1, sizeof(int));
        limit_values = PyMem_Calloc(n_limits ? (size_t)n_limits : 1, sizeof(int));
        if (limit_ids == NULL || limit_values == NULL) {
            Py_DECREF(fast);
            PyErr_NoMemory();
            goto fail_args;
        }
        for (Py_ssize_t i = 0; i < n_limits; i++) {
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "ii", &limit_ids[i], &limit_values[i])) {
                Py_DECREF(fast);
                goto fail_args;
            }
        }
        Py_DECREF(fast);
    }

    Scan s;
    memset(&s, 0, sizeof(s));
    for (int i = 0; i < MAX_COLUMNS; i++) s.kinds[i] = (size_t)i < n_kinds ? kinds[i] : 'i';
    char *names[MAX_COLUMNS] = {NULL};
    Py_BEGIN_ALLOW_THREADS
    scan_run(&s, uri, sql, setup, n_setup, limit_ids, limit_values, n_limits, names);
    Py_END_ALLOW_THREADS

    PyObject *result = NULL;
    if (s.out_of_memory) {
        PyErr_NoMemory();
    } else if (s.error != NULL) {
        PyErr_SetString(ScanError, s.error);
    } else {
        result = result_of(&s, names);
    }
    scan_free(&s);
    for (int i = 0; i < MAX_COLUMNS; i++) free(names[i]);
    PyMem_Free(setup);
    Py_XDECREF(setup_strings);
    PyMem_Free(limit_ids);
    PyMem_Free(limit_values);
    return result;

fail_args:
    PyMem_Free(setup);
    Py_XDECREF(setup_strings);
    PyMem_Free(limit_ids);
    PyMem_Free(limit_values);
    return NULL;
}

/* ---- a rowid table's b-tree, walked without SQLite (table(), see the top) --------------------- */

#define TREE_BLOCK (1 << 20)
#define MAX_SKIP_KEYS 4096 /* distinct count_column values of skipped rows (threads): more gives way */
#define TREE_DEPTH 20
#define TREE_AHEAD_AFTER 4 /* pages in file order before reading ahead */
#define FILTER_SPAN (1 << 16) /* values a filter's bits cover at most (8 kB) */

typedef struct {
    int fd;
    uint32_t page_size, usable;
    int64_t pages;      /* in the file */
    int64_t visited;    /* pages read so far: more than the file has means a cycle */
    uint8_t *block;     /* TREE_BLOCK bytes of the file from block_at */
    int64_t block_at, block_len;
    uint8_t *single;    /* one page read on its own */
    int64_t last_pgno, streak; /* the page read last; how many before it came in file order */
    uint8_t *interior[TREE_DEPTH + 1]; /* a copy of each open interior page */
    const int64_t *ranges; /* flat [lo, hi) pairs */
    Py_ssize_t n_ranges;
    Py_ssize_t range_at; /* the first range a later rowid can fall in */
    const int *wanted; int n_wanted; int max_wanted;
    int decided_by; /* the last column that decides whether a row is kept (filter, skip, count): -1 none */
    char kinds[MAX_COLUMNS]; /* per wanted column: 'i', 't', 'b' or 'n' (table(), at the top) */
    int filter_column; const int64_t *filter; Py_ssize_t n_filter;
    /* The filter as a bit per value from its lowest where its values span less than
       FILTER_SPAN (NVTX event types, a file's launch names): one test a row, not a search. */
    int filter_dense; int64_t filter_base; uint64_t filter_bits[FILTER_SPAN / 64];
    /* Rows whose skip_column holds text starting with skip_prefix are not stored but counted, per
       value of count_column (-1: in all): table()'s folding of per-op NVTX ranges. */
    int skip_column; const uint8_t *skip_prefix; Py_ssize_t skip_len; int count_column;
    int skip_operators; /* 1: also the other texts PyTorch writes for an operator (tree_operator_text) */
    int64_t skip_keys[MAX_SKIP_KEYS], skip_counts[MAX_SKIP_KEYS];
    /* Per key's low byte, 1 + the index of the key last seen with it (0: none): rows of a few
       threads interleave, and a search from the first key at each change cost 3 % of the read. */
    uint16_t skip_hint[256];
    int n_skip_keys, last_skip_key;
    int64_t skip_null; /* skipped rows whose count_column is NULL (or all of them: no count_column) */
    int64_t last_rowid; int any_rowid;
    Scan *scan;
    int unsupported; /* 1: give up (the caller reads through SQLite) */
} Tree;

/* Page pgno (1-based) of the file, or NULL (out of the file, a short read). Read ahead a block
   at a time only once pages have come in file order for a while (a table's leaves usually do;
   tables written side by side interleave, and then one page a read is what is used). */
static const uint8_t *tree_page(Tree *t, int64_t pgno) {
    if (pgno < 2 || pgno > t->pages || ++t->visited > t->pages) return NULL;
    int64_t at = (pgno - 1) * (int64_t)t->page_size;
    t->streak = pgno == t->last_pgno + 1 ? t->streak + 1 : 0;
    t->last_pgno = pgno;
    if (at >= t->block_at && at + t->page_size <= t->block_at + t->block_len) return t->block + (at - t->block_at);
    if (t->streak >= TREE_AHEAD_AFTER) {
        ssize_t got = pread(t->fd, t->block, TREE_BLOCK, (off_t)at);
        if (got < (ssize_t)t->page_size) return NULL;
        t->block_at = at;
        t->block_len = got;
        return t->block;
    }
    if (pread(t->fd, t->single, t->page_size, (off_t)at) != (ssize_t)t->page_size) return NULL;
    return t->single;
}

/* A varint within [p, end): its length (0: runs past end). One byte (a record header's types,
   short payloads) is the common case and is taken first. */
static inline int tree_varint(const uint8_t *p, const uint8_t *end, uint64_t *v) {
    if (p < end && p[0] < 0x80) {
        *v = p[0];
        return 1;
    }
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) {
        if (p + i >= end) return 0;
        x = (x << 7) | (p[i] & 0x7f);
        if (!(p[i] & 0x80)) {
            *v = x;
            return i + 1;
        }
    }
    if (p + 8 >= end) return 0;
    *v = (x << 8) | p[8];
    return 9;
}

/* The size of a value of each one-byte serial type (the file format's table; 10 and 11 are
   reserved: TREE_BAD_TYPE). */
#define TREE_BAD_TYPE 0xFF
static const uint8_t TREE_TYPE_SIZE[128] = {
    0, 1, 2, 3, 4, 6, 8, 8, 0, 0, TREE_BAD_TYPE, TREE_BAD_TYPE,
    0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9,
    10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15, 16, 16, 17, 17, 18, 18, 19, 19,
    20, 20, 21, 21, 22, 22, 23, 23, 24, 24, 25, 25, 26, 26, 27, 27, 28, 28, 29, 29,
    30, 30, 31, 31, 32, 32, 33, 33, 34, 34, 35, 35, 36, 36, 37, 37, 38, 38, 39, 39,
    40, 40, 41, 41, 42, 42, 43, 43, 44, 44, 45, 45, 46, 46, 47, 47, 48, 48, 49, 49,
    50, 50, 51, 51, 52, 52, 53, 53, 54, 54, 55, 55, 56, 56, 57, 57,
};

/* A big-endian two's-complement integer of n bytes (the record format's 1, 2, 3, 4, 6 or 8), read
   by whole loads: a byte loop with a trip count that changed from value to value was a fifth of
   the reader's time (the per-op NVTX shape's tables). */
static inline int64_t tree_int(const uint8_t *p, int n) {
#if defined(__GNUC__)
    uint64_t u;
    switch (n) {
    case 1:
        return (int8_t)p[0];
    case 2:
        return (int16_t)(((uint16_t)p[0] << 8) | p[1]);
    case 3: /* the top byte's sign carried by the int8 cast, the rest unsigned */
        return (int64_t)(((uint64_t)(int64_t)(int8_t)p[0] << 16) | ((uint64_t)p[1] << 8) | p[2]);
    case 4: {
        uint32_t v;
        memcpy(&v, p, 4);
        return (int32_t)__builtin_bswap32(v);
    }
    case 8:
        memcpy(&u, p, 8);
        return (int64_t)__builtin_bswap64(u);
    case 6: {
        uint32_t high;
        uint16_t low;
        memcpy(&high, p, 4);
        memcpy(&low, p + 4, 2);
        u = ((uint64_t)(int64_t)(int32_t)__builtin_bswap32(high) << 16) | __builtin_bswap16(low);
        return (int64_t)u;
    }
    default:
        break;
    }
#endif
    int64_t v = (int8_t)p[0];
    for (int i = 1; i < n; i++) v = (int64_t)(((uint64_t)v << 8) | p[i]);
    return v;
}

/* Whether some range holds a rowid in (after, upto] (after/upto: open ends when absent). */
static int tree_overlaps(const Tree *t, int has_after, int64_t after, int has_upto, int64_t upto) {
    if (t->ranges == NULL) return 1;
    for (Py_ssize_t r = 0; r < t->n_ranges; r++) {
        int64_t lo = t->ranges[2 * r], hi = t->ranges[2 * r + 1]; /* rowids lo .. hi - 1 */
        if (hi <= lo) continue;
        if (has_after && hi - 1 <= after) continue;
        if (has_upto && lo > upto) continue;
        return 1;
    }
    return 0;
}

/* Whether rowid falls in a range (rowids come in increasing order). */
static inline int tree_wanted_rowid(Tree *t, int64_t rowid) {
    if (t->ranges == NULL) return 1;
    while (t->range_at < t->n_ranges && t->ranges[2 * t->range_at + 1] <= rowid) t->range_at++;
    return t->range_at < t->n_ranges && t->ranges[2 * t->range_at] <= rowid;
}

static int tree_in_filter(const Tree *t, int64_t v) {
    if (t->filter_dense) { /* v - base in unsigned arithmetic: a v below base wraps past the span */
        uint64_t at = (uint64_t)v - (uint64_t)t->filter_base;
        return at < FILTER_SPAN && ((t->filter_bits[at >> 6] >> (at & 63)) & 1);
    }
    Py_ssize_t lo = 0, hi = t->n_filter;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (t->filter[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < t->n_filter && t->filter[lo] == v;
}

/* One leaf cell: its rowid and record, the wanted values stored (or the row skipped); -1 to
   give up (t->unsupported or s->out_of_memory say why, else the page is malformed). A record
   spilling to overflow pages is read when every value needed lies in the cell's own part. */
#define VALUE_SIZE(type) ((type) <= 4 ? (type) : (type) == 5 ? 6 : (type) <= 7 ? 8 : (type) <= 9 ? 0 : ((type) - 12) / 2)
#define IS_INT(type) ((type) <= 6 || (type) == 8 || (type) == 9)
/* Whether text (len bytes, of which the first local are at hand) is in a form PyTorch's
   emit_nvtx writes for an operator or an autograd node and no user range takes (rows.py, Skip):
   it holds ", seq = " (an autograd sequence number: record_function scopes have none), or it
   holds ", op_id = " and starts with an operator namespace, lowercase letters, digits and '_'
   then "::" (aten::, c10d::, flash_attn::; FSDP::pre_forward is a scope). 1, 0, or -1 when the
   text, not folded by what its local bytes hold, continues on an overflow page (SQLite reads it). */
static int tree_operator_text(const uint8_t *text, uint64_t len, uint64_t local) {
    static const char seq[] = ", seq = ", op_id[] = ", op_id = ";
    uint64_t at = local < len ? local : len;
    if (memmem(text, at, seq, sizeof seq - 1) != NULL) return 1;
    int has_op_id = memmem(text, at, op_id, sizeof op_id - 1) != NULL;
    uint64_t n = 0;
    while (n < at && ((text[n] >= 'a' && text[n] <= 'z') || (text[n] >= '0' && text[n] <= '9') || text[n] == '_'))
        n++;
    int namespaced = n > 0 && n + 2 <= at && text[n] == ':' && text[n + 1] == ':';
    if (has_op_id && namespaced) return 1;
    return at == len ? 0 : -1; /* a marker may still follow past the local bytes */
}

/* Whether the row whose header was parsed as far as t->decided_by is kept: 1, or 0 when the
   filter leaves it out or the prefix folds it (counted), or -1 to give up (unsupported). */
static int tree_decide(Tree *t, const uint8_t *record, uint64_t local, const uint64_t *types,
                       const uint64_t *offsets, int reached) {
    if (t->filter_column >= 0) {
        int c = t->filter_column;
        if (c >= reached || types[c] == 0) return 0;
        if (!IS_INT(types[c]) || offsets[c] + VALUE_SIZE(types[c]) > local) {
            t->unsupported = 1;
            return -1;
        }
        uint64_t ft = types[c];
        int64_t v = ft == 8 ? 0 : ft == 9 ? 1 : tree_int(record + offsets[c], (int)VALUE_SIZE(ft));
        if (!tree_in_filter(t, v)) return 0;
    }
    if (t->skip_column >= 0) {
        int c = t->skip_column;
        uint64_t st = c < reached ? types[c] : 0;
        int folded = 0;
        if (st >= 13 && (st & 1) && (st - 12) / 2 >= (uint64_t)t->skip_len) { /* text as long as the prefix */
            if (offsets[c] + (uint64_t)t->skip_len > local) {
                t->unsupported = 1; /* the prefix itself on an overflow page */
                return -1;
            }
            folded = memcmp(record + offsets[c], t->skip_prefix, (size_t)t->skip_len) == 0;
        }
        if (!folded && t->skip_operators && st >= 13 && (st & 1)) {
            uint64_t len = (st - 13) / 2;
            uint64_t here = offsets[c] < local ? local - offsets[c] : 0;
            int form = tree_operator_text(record + offsets[c], len, here);
            if (form < 0) {
                t->unsupported = 1;
                return -1;
            }
            folded = form;
        }
        if (folded) {
            int k = t->count_column;
            if (k < 0 || k >= reached || types[k] == 0) {
                t->skip_null++;
                return 0;
            }
            if (!IS_INT(types[k]) || offsets[k] + VALUE_SIZE(types[k]) > local) {
                t->unsupported = 1;
                return -1;
            }
            uint64_t kt = types[k];
            int64_t key = kt == 8 ? 0 : kt == 9 ? 1 : tree_int(record + offsets[k], (int)VALUE_SIZE(kt));
            int at = t->last_skip_key; /* rows of one thread come in runs: try the last key first */
            if (at >= t->n_skip_keys || t->skip_keys[at] != key) {
                uint16_t *hint = &t->skip_hint[(uint64_t)key & 0xFF];
                at = *hint ? *hint - 1 : 0;
                if (at >= t->n_skip_keys || t->skip_keys[at] != key) {
                    for (at = 0; at < t->n_skip_keys && t->skip_keys[at] != key; at++) {
                    }
                }
                if (at < MAX_SKIP_KEYS) *hint = (uint16_t)(at + 1);
                if (at == t->n_skip_keys) {
                    if (at == MAX_SKIP_KEYS) {
                        t->unsupported = 1;
                        return -1;
                    }
                    t->skip_keys[at] = key;
                    t->skip_counts[at] = 0;
                    t->n_skip_keys++;
                }
                t->last_skip_key = at;
            }
            t->skip_counts[at]++;
            return 0;
        }
    }
    return 1;
}

/* A table leaf's cell at ``cell`` (its page ends at ``end``): its payload's size, its rowid, and
   the payload's part on the page (the file format's rule for table leaves; past it, when the
   payload spills, a 4-byte overflow page number, also within the page); *record is where the
   payload starts. -1 when the cell runs past its page. */
static inline int tree_cell_head(const uint8_t *cell, const uint8_t *end, uint64_t usable, uint64_t *payload,
                                 int64_t *rowid, uint64_t *local, const uint8_t **record) {
    uint64_t rowid_u;
    int k = tree_varint(cell, end, payload);
    if (!k) return -1;
    cell += k;
    k = tree_varint(cell, end, &rowid_u);
    if (!k) return -1;
    cell += k;
    *rowid = (int64_t)rowid_u;
    uint64_t most = usable - 35;
    *local = *payload;
    if (*payload > most) {
        uint64_t least = ((usable - 12) * 32 / 255) - 23;
        *local = least + (*payload - least) % (usable - 4);
        if (*local > most) *local = least;
        if (*local + 4 > (uint64_t)(end - cell)) return -1;
    } else if (*payload > (uint64_t)(end - cell)) {
        return -1;
    }
    *record = cell;
    return 0;
}

static int tree_cell(Tree *t, const uint8_t *cell, const uint8_t *end) {
    uint64_t payload, local, header_len;
    int64_t rowid;
    const uint8_t *record;
    if (tree_cell_head(cell, end, t->usable, &payload, &rowid, &local, &record) != 0) return -1;
    if (t->any_rowid && rowid <= t->last_rowid) return -1;
    t->any_rowid = 1;
    t->last_rowid = rowid;
    if (!tree_wanted_rowid(t, rowid)) return 0;
    int k = tree_varint(record, record + local, &header_len);
    if (!k || header_len > payload || header_len < (uint64_t)k) return -1;
    if (header_len > local) {
        t->unsupported = 1; /* the header itself spills: SQLite reads it */
        return -1;
    }
    const uint8_t *h = record + k, *h_end = record + header_len;
    uint64_t body = header_len; /* the next value's offset in the payload */
    uint64_t types[MAX_COLUMNS], offsets[MAX_COLUMNS];
    int reached = 0; /* the record's columns parsed (a record may end before the table's last) */
    /* The header is parsed as far as the columns that decide whether the row is kept (filtered
       or skipped), then, for a row kept, on to the last column wanted: a folded per-op NVTX
       range (95 % of such a table) is decided by its text and thread, the 3rd and 4th of the
       columns read, and the rest of its header is never parsed. */
    int upto = t->decided_by;
    for (int phase = 0; phase < 2; phase++, upto = t->max_wanted) {
        for (; reached <= upto && h < h_end; reached++) {
            uint64_t type, size;
            if (*h < 0x80) { /* a one-byte type: every number, and text or bytes under 58 bytes */
                type = *h++;
                size = TREE_TYPE_SIZE[type];
                if (size == TREE_BAD_TYPE) return -1; /* 10, 11: reserved */
            } else {
                k = tree_varint(h, h_end, &type);
                if (!k) return -1;
                h += k;
                size = (type - 12) / 2; /* two bytes or more: 128 and up, text or bytes */
                if (body > payload || size > payload - body) return -1; /* before a huge size wraps the sum */
            }
            /* Stored for every column parsed (a branch per column cost more than the stores). */
            types[reached] = type;
            offsets[reached] = body;
            body += size;
        }
        /* Sizes are never negative: the values overrun the payload iff their sum does (one check,
           not one a column; a one-byte type's size is at most 57, so the sum cannot wrap). */
        if (body > payload) return -1;
        if (phase == 0) {
            int decided = tree_decide(t, record, local, types, offsets, reached);
            if (decided <= 0) return decided; /* not kept (0), or given up (-1) */
        }
    }
    Scan *s = t->scan;
    if (s->rows == s->capacity && scan_grow(s) != 0) {
        s->out_of_memory = 1;
        return -1;
    }
    /* Each value is checked as it is stored, in one pass: a value that cannot be read here gives
       the whole read up (the caller reads the table through SQLite), so a row left half stored
       is never used. */
    Py_ssize_t r = s->rows;
    for (int w = 0; w < t->n_wanted; w++) {
        int c = t->wanted[w];
        char kind = t->kinds[w];
        int null = c >= 0 && (c >= reached || types[c] == 0); /* past the record's end: NULL too */
        if (c >= 0 && !null && kind != 'n') {
            uint64_t type = types[c];
            int ok = kind == 'i' ? IS_INT(type) : type >= 12; /* text and blobs: bytes as they are */
            if (!ok || offsets[c] + VALUE_SIZE(type) > local) {
                t->unsupported = 1; /* SQLite's CAST rules, or a value on an overflow page */
                return -1;
            }
        }
        if (c < 0) {
            s->values[w][r] = rowid;
        } else if (kind == 'n') {
            s->values[w][r] = null;
        } else if (kind == 't' || kind == 'b') { /* IFNULL(CAST(x AS TEXT|BLOB), ''): never null */
            uint64_t n = null ? 0 : VALUE_SIZE(types[c]);
            if (scan_append(s, w, r, null ? NULL : record + offsets[c], (size_t)n) != 0) {
                s->out_of_memory = 1;
                return -1;
            }
        } else if (!null) {
            uint64_t type = types[c];
            s->values[w][r] = type == 8 ? 0 : type == 9 ? 1 : tree_int(record + offsets[c], (int)VALUE_SIZE(type));
        } else {
            s->values[w][r] = 0;
            if (s->validity[w] == NULL && scan_start_validity(s, w) != 0) {
                s->out_of_memory = 1;
                return -1;
            }
            s->validity[w][r >> 3] &= (uint8_t) ~(1u << (r & 7));
        }
    }
#undef VALUE_SIZE
#undef IS_INT
    s->rows = r + 1;
    return 0;
}

/* The subtree of page pgno whose rowids lie in (after, upto]; -1 to give up. */
static int tree_walk(Tree *t, int64_t pgno, int depth, int has_after, int64_t after, int has_upto, int64_t upto) {
    if (depth > TREE_DEPTH) return -1;
    const uint8_t *page = tree_page(t, pgno);
    if (page == NULL) return -1;
    const uint8_t *end = page + t->usable;
    uint8_t kind = page[0];
    if (kind == 0x0D) { /* a table leaf */
        int cells = (page[3] << 8) | page[4];
        if (8 + 2 * cells > (int)t->usable) return -1;
        for (int c = 0; c < cells; c++) {
            int off = (page[8 + 2 * c] << 8) | page[9 + 2 * c];
            if (off < 8 + 2 * cells || off >= (int)t->usable) return -1;
            if (tree_cell(t, page + off, end) != 0) return -1;
        }
        return 0;
    }
    if (kind != 0x05) return -1; /* not a table b-tree page */
    int cells = (page[3] << 8) | page[4];
    if (12 + 2 * cells > (int)t->usable) return -1;
    uint8_t *copy = t->interior[depth];
    memcpy(copy, page, t->usable); /* the block under it changes as the children are read */
    end = copy + t->usable;
    int64_t lower = after;
    int has_lower = has_after;
    for (int c = 0; c <= cells; c++) {
        int64_t child, key = 0;
        int has_key = 0;
        if (c < cells) {
            int off = (copy[12 + 2 * c] << 8) | copy[13 + 2 * c];
            if (off < 12 + 2 * cells || off + 4 >= (int)t->usable) return -1;
            const uint8_t *cell = copy + off;
            child = ((int64_t)cell[0] << 24) | (cell[1] << 16) | (cell[2] << 8) | cell[3];
            uint64_t key_u;
            if (!tree_varint(cell + 4, end, &key_u)) return -1;
            key = (int64_t)key_u;
            if (c > 0 && key <= lower) return -1; /* keys out of order: a damaged page */
            has_key = 1;
        } else {
            child = ((int64_t)copy[8] << 24) | (copy[9] << 16) | (copy[10] << 8) | copy[11];
        }
        /* The child holds rowids in (lower, key]; clipped to (after, upto]. */
        int64_t hi_bound = has_key ? key : upto;
        int has_hi = has_key || has_upto;
        if (has_key && has_upto && upto < key) hi_bound = upto;
        if (has_lower && has_hi && hi_bound <= lower) break; /* past the part asked for */
        if (tree_overlaps(t, has_lower, lower, has_hi, hi_bound)) {
            if (tree_walk(t, child, depth + 1, has_lower, lower, has_hi, hi_bound) != 0) return -1;
        }
        if (!has_key) break;
        if (has_upto && key >= upto) break;
        lower = key;
        has_lower = 1;
    }
    return 0;
}

static PyObject *table_scan(PyObject *module, PyObject *args) {
    const char *path;
    long long root;
    PyObject *columns_obj, *names_obj, *ranges_obj, *filter_obj;
    int filter_column;
    (void)module;
    const char *kinds = "";
    Py_ssize_t n_kinds = 0;
    int skip_column = -1, count_column = -1;
    const char *skip_prefix = "";
    Py_ssize_t skip_len = 0;
    int skip_operators = 0;
    if (!PyArg_ParseTuple(args, "sLOOOiO|s#iy#ip", &path, &root, &columns_obj, &names_obj, &ranges_obj,
                          &filter_column, &filter_obj, &kinds, &n_kinds, &skip_column, &skip_prefix, &skip_len,
                          &count_column, &skip_operators))
        return NULL;
    PyObject *columns_seq = PySequence_Fast(columns_obj, "columns must be a sequence");
    if (columns_seq == NULL) return NULL;
    Py_ssize_t n_wanted = PySequence_Fast_GET_SIZE(columns_seq);
    int wanted[MAX_COLUMNS];
    int max_wanted = filter_column;
    int64_t *ranges = NULL, *filter = NULL;
    Py_ssize_t n_ranges = 0, n_filter = 0;
    PyObject *result = NULL, *keep_names = NULL;
    const char **names = NULL;
    Py_ssize_t n_names = 0;
    Scan s;
    memset(&s, 0, sizeof s);
    Tree t;
    memset(&t, 0, sizeof t);
    t.fd = -1;
    if (n_wanted < 1 || n_wanted > MAX_COLUMNS || filter_column >= MAX_COLUMNS || skip_column >= MAX_COLUMNS ||
        count_column >= MAX_COLUMNS) {
        PyErr_SetString(PyExc_ValueError, "table: 1 to 64 columns");
        goto done;
    }
    if (skip_column >= 0 && skip_len < 1) {
        PyErr_SetString(PyExc_ValueError, "table: skipping rows needs a prefix of at least one byte");
        goto done;
    }
    if (skip_column > max_wanted) max_wanted = skip_column;
    if (count_column > max_wanted) max_wanted = count_column;
    for (Py_ssize_t i = 0; i < n_wanted; i++) {
        long c = PyLong_AsLong(PySequence_Fast_GET_ITEM(columns_seq, i));
        if (c == -1 && PyErr_Occurred()) goto done;
        if (c < -1 || c >= MAX_COLUMNS) {
            PyErr_SetString(PyExc_ValueError, "table: a column index out of range");
            goto done;
        }
        wanted[i] = (int)c;
        if (c > max_wanted) max_wanted = (int)c;
    }
    if (string_list(names_obj, &names, &n_names, &keep_names) != 0) goto done;
    if (n_names != n_wanted) {
        PyErr_SetString(PyExc_ValueError, "table: one name per column");
        goto done;
    }
    if (ranges_obj != Py_None) {
        PyObject *seq = PySequence_Fast(ranges_obj, "ranges must be a sequence");
        if (seq == NULL) goto done;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        ranges = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        for (Py_ssize_t i = 0; ranges != NULL && i < n; i++) ranges[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        Py_DECREF(seq);
        if (ranges == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (PyErr_Occurred()) goto done;
        if (n % 2) {
            PyErr_SetString(PyExc_ValueError, "table: ranges are (lo, hi) pairs");
            goto done;
        }
        n_ranges = n / 2;
        for (Py_ssize_t r = 1; r < n_ranges; r++) {
            if (ranges[2 * r] < ranges[2 * r - 1]) {
                PyErr_SetString(PyExc_ValueError, "table: ranges must be sorted and disjoint");
                goto done;
            }
        }
        /* Rows the ranges hold, at most HINT_ROWS_MAX: the rows read, where none is filtered
           out or skipped (a filtered read, such as the launch rows of an API table, may keep
           a fraction of them: it grows as it goes). */
        Py_ssize_t most = 0;
        for (Py_ssize_t r = 0; filter_column < 0 && skip_column < 0 && r < n_ranges && most < HINT_ROWS_MAX; r++) {
            int64_t lo = ranges[2 * r], hi = ranges[2 * r + 1];
            if (hi > lo) most += hi - lo > (int64_t)HINT_ROWS_MAX ? HINT_ROWS_MAX : (Py_ssize_t)(hi - lo);
        }
        if (most > HINT_ROWS_MAX) most = HINT_ROWS_MAX;
        s.first_capacity = (most + 7) & ~(Py_ssize_t)7;
    }
    if (filter_column >= 0) {
        PyObject *seq = PySequence_Fast(filter_obj, "filter_values must be a sequence");
        if (seq == NULL) goto done;
        n_filter = PySequence_Fast_GET_SIZE(seq);
        filter = malloc(sizeof(int64_t) * (size_t)(n_filter ? n_filter : 1));
        for (Py_ssize_t i = 0; filter != NULL && i < n_filter; i++)
            filter[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        Py_DECREF(seq);
        if (filter == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (PyErr_Occurred()) goto done;
        for (Py_ssize_t i = 1; i < n_filter; i++) {
            if (filter[i] < filter[i - 1]) {
                PyErr_SetString(PyExc_ValueError, "table: filter_values must be sorted");
                goto done;
            }
        }
    }
    s.columns = (int)n_wanted;
    int any_bytes = 0;
    for (int i = 0; i < s.columns; i++) {
        char kind = i < n_kinds ? kinds[i] : 'i';
        if (kind != 'i' && kind != 't' && kind != 'b' && kind != 'n') {
            PyErr_SetString(PyExc_ValueError, "table: kinds are 'i', 't', 'b' or 'n'");
            goto done;
        }
        if (kind != 'i' && kind != 'n' && wanted[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "table: the rowid is an integer");
            goto done;
        }
        t.kinds[i] = kind;
        s.kinds[i] = kind == 'n' ? 'i' : kind;
        any_bytes |= kind == 't' || kind == 'b';
    }
    t.wanted = wanted;
    t.n_wanted = (int)n_wanted;
    t.max_wanted = max_wanted;
    t.decided_by = filter_column;
    if (skip_column > t.decided_by) t.decided_by = skip_column;
    if (skip_column >= 0 && count_column > t.decided_by) t.decided_by = count_column;
    t.ranges = ranges;
    t.n_ranges = n_ranges;
    t.filter_column = filter_column;
    t.skip_column = skip_column;
    t.skip_prefix = (const uint8_t *)skip_prefix;
    t.skip_len = skip_len;
    t.skip_operators = skip_column >= 0 && skip_operators;
    t.count_column = skip_column >= 0 ? count_column : -1;
    t.filter = filter;
    t.n_filter = n_filter;
    /* Sorted (the binary search's order): the span is the last value less the first. */
    t.filter_dense = n_filter > 0 && (uint64_t)filter[n_filter - 1] - (uint64_t)filter[0] < FILTER_SPAN;
    t.filter_base = n_filter > 0 ? filter[0] : 0;
    for (Py_ssize_t i = 0; i < n_filter && t.filter_dense; i++) {
        uint64_t at = (uint64_t)filter[i] - (uint64_t)t.filter_base;
        t.filter_bits[at >> 6] |= (uint64_t)1 << (at & 63);
    }
    t.scan = &s;
    int gave_up = 0, os_error = 0, os_errno = 0;
    Py_BEGIN_ALLOW_THREADS
    uint8_t header[100];
    t.fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (t.fd < 0 || fstat(t.fd, &st) != 0) {
        os_error = 1;
        os_errno = errno;
    } else if (pread(t.fd, header, 100, 0) != 100 || memcmp(header, "SQLite format 3", 16) != 0) {
        gave_up = 1;
    } else {
        uint32_t size = ((uint32_t)header[16] << 8) | header[17];
        if (size == 1) size = 65536;
        t.page_size = size;
        t.usable = size - header[20];
        uint32_t encoding = ((uint32_t)header[56] << 24) | ((uint32_t)header[57] << 16) | (header[58] << 8) | header[59];
        if (size < 512 || (size & (size - 1)) || t.usable < 480 || (any_bytes && encoding != 1)) {
            gave_up = 1; /* text not stored as UTF-8 is SQLite's to convert */
        } else {
            t.pages = (int64_t)st.st_size / size;
            t.block = aligned_block(TREE_BLOCK);
            t.single = aligned_block(size);
            if (t.single == NULL) t.block = (free(t.block), NULL);
            t.block_at = -1;
            for (int d = 0; d <= TREE_DEPTH && t.block != NULL; d++) {
                t.interior[d] = malloc(t.usable);
                if (t.interior[d] == NULL) t.block = (free(t.block), NULL);
            }
            if (t.block == NULL) s.out_of_memory = 1;
            else if (tree_walk(&t, root, 0, 0, 0, 0, 0) != 0) gave_up = 1;
        }
    }
    Py_END_ALLOW_THREADS
    if (os_error) {
        errno = os_errno;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        goto done;
    }
    if (s.out_of_memory) {
        PyErr_NoMemory();
        goto done;
    }
    if (gave_up || t.unsupported) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    if (s.rows == 0 && scan_grow(&s) != 0) { /* no rows: still real buffers */
        PyErr_NoMemory();
        goto done;
    }
    result = result_of(&s, (char **)names);
    if (result != NULL && skip_column >= 0) { /* (names, columns, rows, [(count_column value | None, rows skipped)]) */
        PyObject *skipped = PyList_New(0);
        PyObject *grown = NULL;
        for (int k = 0; skipped != NULL && k <= t.n_skip_keys; k++) {
            PyObject *pair = k < t.n_skip_keys ? Py_BuildValue("(LL)", (long long)t.skip_keys[k], (long long)t.skip_counts[k])
                             : t.skip_null ? Py_BuildValue("(OL)", Py_None, (long long)t.skip_null)
                                           : NULL;
            if (pair == NULL && (k < t.n_skip_keys || t.skip_null)) Py_CLEAR(skipped);
            else if (pair != NULL && PyList_Append(skipped, pair) != 0) Py_CLEAR(skipped);
            Py_XDECREF(pair);
        }
        if (skipped != NULL) grown = PyTuple_Pack(4, PyTuple_GET_ITEM(result, 0), PyTuple_GET_ITEM(result, 1),
                                                  PyTuple_GET_ITEM(result, 2), skipped);
        Py_XDECREF(skipped);
        Py_DECREF(result);
        result = grown;
    }
done:
    if (t.fd >= 0) close(t.fd);
    free(t.block);
    free(t.single);
    for (int d = 0; d <= TREE_DEPTH; d++) free(t.interior[d]);
    free(ranges);
    free(filter);
    PyMem_Free(names);
    Py_XDECREF(keep_names);
    scan_free(&s);
    Py_DECREF(columns_seq);
    return result;
}

/* A C-contiguous buffer of signed integers of `itemsize` bytes (0: 4 or 8); another type is refused. */
/* ---- one row found by its rowid, without SQLite (seek(), see the top) ----------------------- */

typedef struct {
    int fd;
    uint32_t page_size, usable;
    int64_t pages, visited;
    int64_t at;  /* the rowid sought: the first row at or after it */
    int column;  /* the record position of the value wanted */
    uint8_t *buffers[TREE_DEPTH + 1]; /* one page per level (aligned: tree_page's reason) */
    int64_t rowid, value;
    int null;
} Seek;

/* The first row of page pgno's subtree with a rowid >= s->at: 1 found (s->rowid, s->value,
   s->null), 0 none there, -1 to give up (a damaged file, or a value SQLite would convert). An
   interior key bounds its left child from above but need not be a rowid it holds (rows deleted),
   so a child without such a row passes on to the next. */
static int seek_walk(Seek *s, int64_t pgno, int depth) {
    if (depth > TREE_DEPTH || pgno < 2 || pgno > s->pages || ++s->visited > s->pages) return -1;
    if (s->buffers[depth] == NULL && (s->buffers[depth] = aligned_block(s->page_size)) == NULL) return -1;
    uint8_t *page = s->buffers[depth];
    if (pread(s->fd, page, s->page_size, (off_t)((pgno - 1) * (int64_t)s->page_size)) != (ssize_t)s->page_size) return -1;
    const uint8_t *end = page + s->usable;
    int cells = (page[3] << 8) | page[4];
    if (page[0] == 0x05) {
        if (12 + 2 * cells > (int)s->usable) return -1;
        for (int c = 0; c <= cells; c++) {
            int64_t child;
            if (c < cells) {
                int off = (page[12 + 2 * c] << 8) | page[13 + 2 * c];
                if (off < 12 + 2 * cells || off + 4 >= (int)s->usable) return -1;
                uint64_t key;
                if (!tree_varint(page + off + 4, end, &key)) return -1;
                if ((int64_t)key < s->at) continue; /* that child's rowids are all below it */
                child = ((int64_t)page[off] << 24) | (page[off + 1] << 16) | (page[off + 2] << 8) | page[off + 3];
            } else {
                child = ((int64_t)page[8] << 24) | (page[9] << 16) | (page[10] << 8) | page[11];
            }
            int found = seek_walk(s, child, depth + 1);
            if (found != 0) return found;
        }
        return 0;
    }
    if (page[0] != 0x0D || 8 + 2 * cells > (int)s->usable) return -1; /* not a table b-tree page */
    for (int c = 0; c < cells; c++) {
        int off = (page[8 + 2 * c] << 8) | page[9 + 2 * c];
        if (off < 8 + 2 * cells || off >= (int)s->usable) return -1;
        uint64_t payload, local, header_len;
        int64_t rowid;
        const uint8_t *cell;
        if (tree_cell_head(page + off, end, s->usable, &payload, &rowid, &local, &cell) != 0) return -1;
        if (rowid < s->at) continue;
        int k = tree_varint(cell, cell + local, &header_len);
        if (!k || header_len > local || header_len < (uint64_t)k) return -1;
        const uint8_t *h = cell + k, *h_end = cell + header_len;
        uint64_t body = header_len, type = 0;
        int reached = 0;
        for (; reached <= s->column && h < h_end; reached++) {
            k = tree_varint(h, h_end, &type);
            if (!k) return -1;
            h += k;
            if (type == 10 || type == 11) return -1;
            if (reached < s->column) body += type >= 12 ? (type - 12) / 2 : TREE_TYPE_SIZE[type];
            if (body > payload) return -1; /* sizes past the record: a damaged one (and no wrap) */
        }
        s->rowid = rowid;
        if (reached <= s->column || type == 0) { /* past the record's end, or NULL */
            s->null = 1;
            s->value = 0;
            return 1;
        }
        if (type >= 10 || type == 7) return -1; /* a real, text or blob: SQLite's CAST rules */
        uint64_t size = TREE_TYPE_SIZE[type];
        if (body + size > local) return -1; /* on an overflow page */
        s->null = 0;
        s->value = type == 8 ? 0 : type == 9 ? 1 : tree_int(cell + body, (int)size);
        return 1;
    }
    return 0;
}

static PyObject *seek(PyObject *module, PyObject *args) {
    int fd, column;
    long long root, at;
    (void)module;
    if (!PyArg_ParseTuple(args, "iLLi", &fd, &root, &at, &column)) return NULL;
    if (column < 0 || column >= MAX_COLUMNS) {
        PyErr_SetString(PyExc_ValueError, "column must be a record position (0 or more)");
        return NULL;
    }
    Seek s;
    memset(&s, 0, sizeof s);
    s.fd = fd;
    s.at = at;
    s.column = column;
    int found = -1, os_errno = 0;
    /* The GIL is kept: a seek is a few page reads from the page cache (7 us), and giving the GIL up
       and taking it back behind the threads running Python cost more (the per-op NVTX shape's
       10 k probes on the reading thread: 0.31-0.33 s released, 0.13-0.16 s kept). */
    uint8_t header[100];
    struct stat st;
    if (fstat(fd, &st) != 0) {
        os_errno = errno;
    } else if (pread(fd, header, 100, 0) == 100 && memcmp(header, "SQLite format 3", 16) == 0) {
        uint32_t size = ((uint32_t)header[16] << 8) | header[17];
        if (size == 1) size = 65536;
        s.page_size = size;
        s.usable = size - header[20];
        if (size >= 512 && !(size & (size - 1)) && s.usable >= 480) {
            s.pages = (int64_t)st.st_size / size;
            found = seek_walk(&s, root, 0);
        }
    }
    for (int d = 0; d <= TREE_DEPTH; d++) free(s.buffers[d]);
    if (os_errno) {
        errno = os_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (found < 0) Py_RETURN_FALSE;
    if (found == 0) Py_RETURN_NONE;
    if (s.null) return Py_BuildValue("(LO)", (long long)s.rowid, Py_None);
    return Py_BuildValue("(LL)", (long long)s.rowid, (long long)s.value);
}

static int int_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int size_ok = itemsize ? view->itemsize == itemsize : view->itemsize == 4 || view->itemsize == 8;
    int integer = f[0] != '\0' && f[1] == '\0' && strchr(view->itemsize == 8 ? "ql" : "il", f[0]) != NULL;
    if (!size_ok || !integer) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "split_ids: int64 ids, an int32 or int64 pid output, an int32 tid output");
        return -1;
    }
    return 0;
}

static PyObject *split_ids(PyObject *module, PyObject *args) {
    PyObject *ids_obj, *pid_obj, *tid_obj;
    (void)module;
    if (!PyArg_ParseTuple(args, "OOO", &ids_obj, &pid_obj, &tid_obj)) return NULL;
    Py_buffer ids, pid, tid;
    if (int_buffer(ids_obj, &ids, 0, 8) < 0) return NULL;
    if (int_buffer(pid_obj, &pid, 1, 0) < 0) {
        PyBuffer_Release(&ids);
        return NULL;
    }
    int with_tid = tid_obj != Py_None;
    if (with_tid && int_buffer(tid_obj, &tid, 1, 4) < 0) {
        PyBuffer_Release(&ids);
        PyBuffer_Release(&pid);
        return NULL;
    }
    Py_ssize_t n = ids.len / 8;
    if (pid.len != n * pid.itemsize || (with_tid && tid.len != n * 4)) {
        PyBuffer_Release(&ids);
        PyBuffer_Release(&pid);
        if (with_tid) PyBuffer_Release(&tid);
        PyErr_SetString(PyExc_ValueError, "split_ids: outputs of the ids' length");
        return NULL;
    }
    const int64_t *g = ids.buf;
    int wide = pid.itemsize == 8;
    Py_BEGIN_ALLOW_THREADS
    /* The mask keeps bits 24-47 of g: an arithmetic or logical shift gives the same. */
    if (wide) {
        int64_t *p = pid.buf;
        for (Py_ssize_t i = 0; i < n; i++) p[i] = (g[i] >> 24) & 0xFFFFFF;
    } else {
        int32_t *p = pid.buf;
        for (Py_ssize_t i = 0; i < n; i++) p[i] = (int32_t)((g[i] >> 24) & 0xFFFFFF);
    }
    if (with_tid) {
        int32_t *t = tid.buf;
        for (Py_ssize_t i = 0; i < n; i++) t[i] = (int32_t)(g[i] & 0xFFFFFF);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ids);
    PyBuffer_Release(&pid);
    if (with_tid) PyBuffer_Release(&tid);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_VARARGS | METH_KEYWORDS,
     "scan(uri, sql, setup=(), limits=(), kinds='') -> (names, [(data, validity | None) or (offsets, data, "
     "validity | None)], rows)"},
    {"table", table_scan, METH_VARARGS,
     "table(path, root, columns, names, ranges, filter_column, filter_values, kinds='', skip_column=-1, "
     "skip_prefix=b'', count_column=-1, skip_operators=False) -> (names, [(data, validity | None)], rows[, skipped]) | None"},
    {"seek", seek, METH_VARARGS,
     "seek(fd, root, at, column) -> (rowid, value | None) | None | False: the first row with rowid >= at"},
    {"split_ids", split_ids, METH_VARARGS,
     "split_ids(global_ids, pid, tid | None): SQLite's (g >> 24) & 0xFFFFFF and g & 0xFFFFFF of int64 ids, in place"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_int_scan", "Integer columns of a SQLite query as Arrow buffers.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__int_scan(void) {
    if (PyType_Ready(&BlockType) < 0) return NULL;
    ahead_ready = ahead_register() == 0;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    ScanError = PyErr_NewException("traceguard.ingest._int_scan.Error", NULL, NULL);
    if (ScanError == NULL || PyModule_AddObject(module, "Error", ScanError) < 0) {
        Py_XDECREF(ScanError);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(ScanError);
    return module;
}
