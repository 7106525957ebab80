/* cmd_info.c — placeholder while the engine lands; replaced in the foundation work. */
#include <stdio.h>
#include "cli.h"
static int cmd_main(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "ekv info: not built yet\n"); return 1; }
const struct ekv_cmd ekv_cmd_info = {"info", "not built yet", cmd_main};
