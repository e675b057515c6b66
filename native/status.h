#ifndef MVC_STATUS_H
#define MVC_STATUS_H
/* Status codes shared by every native coder.  Functions return a value >= 0
 * on success (a size or a count) and one of these negatives on failure; the
 * Python side turns every negative into mvc.codecs.base.CodecError (decoders)
 * or an argument error (encoders). */
enum mvc_status {
    MVC_OK = 0,
    MVC_ERR_CORRUPT = -1,   /* input is not a valid encoding */
    MVC_ERR_TRUNCATED = -2, /* input ends early or has trailing bytes */
    MVC_ERR_ARG = -3,       /* bad argument (width, size, kind) */
    MVC_ERR_NOMEM = -4,     /* an internal allocation failed */
    MVC_ERR_CAPACITY = -5,  /* output buffer too small */
    MVC_ERR_RANGE = -6,     /* a value does not fit the requested type */
    MVC_ERR_INTERNAL = -7,  /* an invariant of the coder broke (a bug) */
    MVC_ERR_AMBIGUOUS = -8  /* a block an old encoder wrote the same for two inputs */
};
#endif
