/* placeholder until the command table lands */
#include <stdio.h>
int main(void) { return 0; }
