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

#define MAX_COLUMNS 64
#define FIRST_ROWS 65536

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
    sqlite3_free(p->block);
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
    if (p->block == NULL) p->block = sqlite3_malloc(AHEAD_BYTES);
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
    Py_ssize_t capacity = s->capacity ? s->capacity * 2 : FIRST_ROWS;
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
        if (s->rows > 0 && s->rows < s->capacity) {
            int64_t *shrunk = realloc(values, bytes);
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

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_VARARGS | METH_KEYWORDS,
     "scan(uri, sql, setup=(), limits=(), kinds='') -> (names, [(data, validity | None) or (offsets, data, "
     "validity | None)], rows)"},
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
