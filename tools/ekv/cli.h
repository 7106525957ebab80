/*
 * cli.h — shared pieces of the ekv sub-commands: the command table entry
 * and option parsing helpers (llama.cpp-style flags).
 */
#ifndef EKV_CLI_H
#define EKV_CLI_H

#include <stdbool.h>
#include <stdint.h>

struct ekv_cmd {
    const char *name;
    const char *summary;
    int (*main)(int argc, char **argv); /* argv[0] is the command name */
};

extern const struct ekv_cmd ekv_cmd_run;
extern const struct ekv_cmd ekv_cmd_info;
extern const struct ekv_cmd ekv_cmd_mkmodel;

#endif
