/* The users page (being built). */
"use strict";
