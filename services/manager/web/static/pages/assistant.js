/* The assistant page (being built). */
"use strict";
