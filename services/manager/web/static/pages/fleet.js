/* The fleet page (being built). */
"use strict";
